package main

import (
	"testing"
	"time"
)

func TestRelTime(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{168*time.Hour - time.Minute, "in 6d23h"},
		{90 * time.Minute, "in 1h30m"},
		{-3*time.Hour - 12*time.Minute, "3h12m ago"},
		{5 * time.Minute, "in 5m"},
		{20 * time.Second, "now"},
		{8 * 24 * time.Hour, "2026-01-10T15:04:05Z"},
	} {
		if got := relTime(now.Add(tc.d), now); got != tc.want {
			t.Errorf("relTime(%s) = %q, want %q", tc.d, got, tc.want)
		}
	}
}
