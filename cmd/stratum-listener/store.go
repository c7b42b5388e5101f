package main

import (
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/stratumjoin/stratum/internal/cli"
	"github.com/stratumjoin/stratum/internal/store/etcdstore"
)

// etcdFlags are the etcd client's TLS and authentication settings. They
// travel to the store as options of its URL (files only, never a secret),
// and default to STRATUM_ETCD_* so a unit's environment file can set them.
type etcdFlags struct {
	cacert, cert, key, user, passwordFile string
}

func (f *etcdFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.cacert, "etcd-cacert", os.Getenv("STRATUM_ETCD_CACERT"), "CA that signs the etcd servers' certificates, PEM ($STRATUM_ETCD_CACERT; default: the system roots)")
	fs.StringVar(&f.cert, "etcd-cert", os.Getenv("STRATUM_ETCD_CERT"), "client certificate for etcd, PEM ($STRATUM_ETCD_CERT)")
	fs.StringVar(&f.key, "etcd-key", os.Getenv("STRATUM_ETCD_KEY"), "key of --etcd-cert, PEM, 0600 ($STRATUM_ETCD_KEY)")
	fs.StringVar(&f.user, "etcd-user", os.Getenv("STRATUM_ETCD_USER"), "etcd user name ($STRATUM_ETCD_USER)")
	fs.StringVar(&f.passwordFile, "etcd-password-file", os.Getenv("STRATUM_ETCD_PASSWORD_FILE"), "file holding the etcd user's password, 0600 ($STRATUM_ETCD_PASSWORD_FILE)")
}

func (f *etcdFlags) set() bool {
	return f.cacert != "" || f.cert != "" || f.key != "" || f.user != "" || f.passwordFile != ""
}

// args gives back the flags as a command line, for messages that say what
// to run.
func (f *etcdFlags) args() string {
	var b strings.Builder
	for _, kv := range [][2]string{{"--etcd-cacert", f.cacert}, {"--etcd-cert", f.cert}, {"--etcd-key", f.key}, {"--etcd-user", f.user}, {"--etcd-password-file", f.passwordFile}} {
		if kv[1] != "" {
			fmt.Fprintf(&b, " %s %s", kv[0], kv[1])
		}
	}
	return b.String()
}

// storeURL adds the etcd flags to the store URL as its options.
func (f *etcdFlags) storeURL(raw string) (string, error) {
	if !f.set() {
		return raw, nil
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "etcd" && u.Scheme != "etcds") {
		return "", cli.Usage(fmt.Errorf("--etcd-* flags need --store etcds://host:port,... (got %q)", raw))
	}
	q := u.Query()
	for _, kv := range [][2]string{{etcdstore.OptCACert, f.cacert}, {etcdstore.OptCert, f.cert}, {etcdstore.OptKey, f.key}, {etcdstore.OptUser, f.user}, {etcdstore.OptPasswordFile, f.passwordFile}} {
		if kv[1] != "" {
			q.Set(kv[0], kv[1])
		}
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}
