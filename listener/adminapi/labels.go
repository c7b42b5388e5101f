package adminapi

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Bounds of a join code's description and labels.
const (
	MaxDescription = 256
	MaxLabels      = 16
)

// A label key is lowercase, starts with a letter and may hold digits,
// '.', '_', '-' and '/' (a prefix such as team/); a value is a short
// token. Both are at most 63 characters, so they fit in a query string,
// a Prometheus label or a Kubernetes label unchanged.
var (
	labelKeyRE   = regexp.MustCompile(`^[a-z]([a-z0-9._/-]{0,61}[a-z0-9])?$`)
	labelValueRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$`)
)

// validateDescription allows printable text of at most MaxDescription
// characters, without control characters (a listing stays one line).
func validateDescription(path, d string) []fieldError {
	switch {
	case !utf8.ValidString(d):
		return []fieldError{{path: path, msg: "must be UTF-8"}}
	case utf8.RuneCountInString(d) > MaxDescription:
		return []fieldError{{path: path, msg: fmt.Sprintf("must be at most %d characters", MaxDescription)}}
	case strings.IndexFunc(d, unicode.IsControl) >= 0:
		return []fieldError{{path: path, msg: "must not hold control characters"}}
	}
	return nil
}

// validateLabels names each bad label at path.KEY, in key order.
func validateLabels(path string, labels map[string]string) []fieldError {
	var errs []fieldError
	if len(labels) > MaxLabels {
		errs = append(errs, fieldError{path: path, msg: fmt.Sprintf("must hold at most %d labels", MaxLabels)})
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		p := path + "." + k
		if len(k) > 63 || !utf8.ValidString(k) {
			p = path
		}
		if !labelKeyRE.MatchString(k) {
			errs = append(errs, fieldError{path: p, msg: "key must match " + labelKeyRE.String()})
			continue
		}
		if !labelValueRE.MatchString(labels[k]) {
			errs = append(errs, fieldError{path: p, msg: "value must match " + labelValueRE.String()})
		}
	}
	return errs
}

// parseLabelSelector reads the repeated `label=KEY=VALUE` query
// parameter of a listing; every pair must match.
func parseLabelSelector(params []string) (map[string]string, []fieldError) {
	if len(params) == 0 {
		return nil, nil
	}
	want := map[string]string{}
	var errs []fieldError
	for _, p := range params {
		k, v, ok := strings.Cut(p, "=")
		if !ok || !labelKeyRE.MatchString(k) || !labelValueRE.MatchString(v) {
			errs = append(errs, fieldError{path: "label", msg: "must be KEY=VALUE, the key matching " + labelKeyRE.String() + " and the value " + labelValueRE.String()})
			continue
		}
		want[k] = v
	}
	return want, errs
}

// hasLabels reports whether labels holds every pair of want.
func hasLabels(labels, want map[string]string) bool {
	for k, v := range want {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}
