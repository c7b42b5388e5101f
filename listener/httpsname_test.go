package listener_test

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"slices"
	"testing"

	"github.com/stratumjoin/stratum/listener"
	"github.com/stratumjoin/stratum/listener/listenertest"
)

// TestHTTPSNames: serve --https-name puts more names into the HTTPS admin
// certificate, which still chains to the cluster CA; without it a client
// asking for that name is refused.
func TestHTTPSNames(t *testing.T) {
	for _, tc := range []struct {
		names []string
		ok    bool
	}{{[]string{"admin.example", "192.0.2.10"}, true}, {nil, false}} {
		l := listenertest.Start(t, listenertest.Options{Config: listener.Config{HTTPSListen: "127.0.0.1:0", HTTPSNames: tc.names}})
		roots := x509.NewCertPool()
		for _, r := range l.Roots() {
			roots.AddCert(r)
		}
		conn, err := tls.Dial("tcp", l.HTTPSAddr().String(), &tls.Config{RootCAs: roots, ServerName: "admin.example", MinVersion: tls.VersionTLS13})
		if !tc.ok {
			if err == nil {
				conn.Close()
				t.Fatal("admin.example verified without --https-name")
			}
			continue
		}
		if err != nil {
			t.Fatalf("dial admin.example: %v", err)
		}
		leaf := conn.ConnectionState().PeerCertificates[0]
		conn.Close()
		if !slices.ContainsFunc(leaf.IPAddresses, func(ip net.IP) bool { return ip.Equal(net.ParseIP("192.0.2.10")) }) {
			t.Errorf("IP SANs %v lack 192.0.2.10", leaf.IPAddresses)
		}
		if !slices.ContainsFunc(leaf.IPAddresses, func(ip net.IP) bool { return ip.Equal(net.ParseIP("127.0.0.1")) }) {
			t.Errorf("IP SANs %v lost the endpoint's 127.0.0.1", leaf.IPAddresses)
		}
	}
}
