package wire

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// DefaultPort is the join listener's UDP port, used when an endpoint names
// none.
const DefaultPort = "9444"

// Endpoint returns s as host:port, adding DefaultPort when s is a bare
// host ("join.example", "192.0.2.7", "::1" or "[::1]"). An empty host or a
// port that is not 1 to 65535 is an error.
func Endpoint(s string) (string, error) {
	s = strings.TrimSpace(s)
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		switch {
		case strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]"):
			host, port = s[1:len(s)-1], DefaultPort
		case strings.Count(s, ":") > 1:
			host, port = s, DefaultPort // a bare IPv6 address
		case !strings.Contains(s, ":"):
			host, port = s, DefaultPort
		default:
			return "", fmt.Errorf("endpoint %q is not host or host:port", s)
		}
	}
	if host == "" {
		return "", fmt.Errorf("endpoint %q has no host", s)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", fmt.Errorf("endpoint %q: port %q is not 1 to 65535", s, port)
	}
	return net.JoinHostPort(host, port), nil
}
