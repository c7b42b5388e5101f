package main

import (
	"fmt"
	"time"
)

// relTime is t for people: "in 6d23h" or "3h12m ago", to the minute, with
// the time itself for anything a week or more away. JSON keeps RFC 3339.
func relTime(t, now time.Time) string {
	d := t.Sub(now)
	suffix, prefix := "", "in "
	if d < 0 {
		d, suffix, prefix = -d, " ago", ""
	}
	switch {
	case d >= 7*24*time.Hour:
		return t.UTC().Format(time.RFC3339)
	case d >= 24*time.Hour:
		return fmt.Sprintf("%s%dd%dh%s", prefix, d/(24*time.Hour), d%(24*time.Hour)/time.Hour, suffix)
	case d >= time.Hour:
		return fmt.Sprintf("%s%dh%dm%s", prefix, d/time.Hour, d%time.Hour/time.Minute, suffix)
	case d >= time.Minute:
		return fmt.Sprintf("%s%dm%s", prefix, d/time.Minute, suffix)
	}
	return "now"
}
