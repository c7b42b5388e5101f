package listener

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/stratumjoin/stratum/internal/cluster"
	"github.com/stratumjoin/stratum/internal/keyseal"
	"github.com/stratumjoin/stratum/internal/pake"
	"github.com/stratumjoin/stratum/pki"
	"github.com/stratumjoin/stratum/pki/authority"
)

// The cluster identity: what every listener of one cluster must hold alike
// (docs/cluster.md). It rests in the store as one record sealed under the
// key-encryption key (KEK); each listener keeps a copy in its key directory
// and applies the store's when it changes.

// KEKFile is the key-encryption key's name in the key directory, and the
// systemd credential it may come from instead ($CREDENTIALS_DIRECTORY).
const KEKFile = "cluster.kek"

// sharedPublic is the record's clear part, authenticated by the seal.
type sharedPublic struct {
	TrustDomain   string            `json:"trustDomain"`
	KSF           pake.KSFParams    `json:"ksf"`
	NodeLifetime  Duration          `json:"nodeLifetime"`
	CAFingerprint string            `json:"caFingerprint"`
	CAChain       string            `json:"caChain"` // ca.crt, PEM
	Roots         string            `json:"roots"`   // roots.pem
	Cross         map[string]string `json:"cross"`   // cross-*.crt by file name
}

// sharedSecret is the sealed part.
type sharedSecret struct {
	CAKey  []byte `json:"caKey"`  // ca.key, PEM
	OPAQUE []byte `json:"opaque"` // opaque.key: AKE key pair, OPRF seed, fake-record seed
}

// ClusterExistsError is init's refusal to make a second cluster in a store
// that holds one.
type ClusterExistsError struct {
	CAFingerprint string
	TrustDomain   string
}

func (e *ClusterExistsError) Error() string {
	return fmt.Sprintf("the store already holds a cluster (trust domain %s, CA fingerprint %s)", e.TrustDomain, e.CAFingerprint)
}

// kekPath is where the listener's KEK is: the systemd credential when
// the unit passes one, else keys/cluster.kek.
func kekPath(keyDir string) string {
	if d := os.Getenv("CREDENTIALS_DIRECTORY"); d != "" {
		p := filepath.Join(d, KEKFile)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return filepath.Join(keyDir, KEKFile)
}

// loadKEK reads the listener's KEK; ok is false when it has none.
func loadKEK(keyDir string) (k keyseal.KEK, path string, ok bool, err error) {
	path = kekPath(keyDir)
	k, err = keyseal.LoadKEK(path)
	if errors.Is(err, fs.ErrNotExist) {
		return k, path, false, nil
	}
	return k, path, err == nil, err
}

// readLocalIdentity reads the identity from a key directory.
func readLocalIdentity(keyDir string, s Settings) (sharedPublic, sharedSecret, error) {
	var pub sharedPublic
	var sec sharedSecret
	read := func(name string) ([]byte, error) { return os.ReadFile(filepath.Join(keyDir, name)) }
	chain, err := read(authority.CACertFile)
	if err != nil {
		return pub, sec, err
	}
	roots, err := read(authority.RootsFile)
	if err != nil {
		return pub, sec, err
	}
	if sec.CAKey, err = read(authority.CAKeyFile); err != nil {
		return pub, sec, err
	}
	if sec.OPAQUE, err = read(opaqueKeyFile); err != nil {
		return pub, sec, err
	}
	certs, err := pki.ParseCertsPEM(chain)
	if err != nil {
		return pub, sec, fmt.Errorf("%s: %w", authority.CACertFile, err)
	}
	pub = sharedPublic{
		TrustDomain: s.TrustDomain, KSF: s.KSF, NodeLifetime: s.NodeLifetime,
		CAFingerprint: pki.FormatFingerprint(pki.FingerprintOf(certs[len(certs)-1])),
		CAChain:       string(chain), Roots: string(roots), Cross: map[string]string{},
	}
	names, _ := filepath.Glob(filepath.Join(keyDir, "cross-*.crt"))
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			return pub, sec, err
		}
		pub.Cross[filepath.Base(n)] = string(b)
	}
	return pub, sec, nil
}

// writeLocalIdentity writes the identity into a key directory, ca.key last.
func writeLocalIdentity(keyDir string, pub sharedPublic, sec sharedSecret) error {
	var files []pki.File
	for _, name := range slices.Sorted(maps.Keys(pub.Cross)) {
		if !strings.HasPrefix(name, "cross-") || strings.ContainsAny(name, `/\`) {
			return fmt.Errorf("cluster identity: bad cross certificate name %q", name)
		}
		files = append(files, pki.File{Name: name, Data: []byte(pub.Cross[name]), Mode: 0o600})
	}
	files = append(files,
		pki.File{Name: opaqueKeyFile, Data: sec.OPAQUE, Mode: 0o600},
		pki.File{Name: authority.RootsFile, Data: []byte(pub.Roots), Mode: 0o600},
		pki.File{Name: authority.CACertFile, Data: []byte(pub.CAChain), Mode: 0o600},
		pki.File{Name: authority.CAKeyFile, Data: sec.CAKey, Mode: 0o600},
	)
	return pki.WriteFiles(keyDir, files)
}

func sealIdentity(k keyseal.KEK, pub sharedPublic, sec sharedSecret) ([]byte, error) {
	p, err := json.Marshal(pub)
	if err != nil {
		return nil, err
	}
	s, err := json.Marshal(sec)
	if err != nil {
		return nil, err
	}
	return keyseal.Seal(k, p, s)
}

// openIdentity opens a sealed identity record read from the store.
func openIdentity(k keyseal.KEK, rec []byte) (sharedPublic, sharedSecret, error) {
	var pub sharedPublic
	var sec sharedSecret
	p, s, err := keyseal.Open(k, rec)
	if err != nil {
		return pub, sec, err
	}
	if err := json.Unmarshal(p, &pub); err != nil {
		return pub, sec, fmt.Errorf("cluster identity: %w", err)
	}
	if err := json.Unmarshal(s, &sec); err != nil {
		return pub, sec, fmt.Errorf("cluster identity: %w", err)
	}
	return pub, sec, nil
}

// publicIdentity reads the record's clear part without the KEK, for
// messages only.
func publicIdentity(rec []byte) (sharedPublic, error) {
	var pub sharedPublic
	p, _, err := keyseal.Public(rec)
	if err != nil {
		return pub, err
	}
	return pub, json.Unmarshal(p, &pub)
}

func sameIdentity(a sharedPublic, as sharedSecret, b sharedPublic, bs sharedSecret) bool {
	return a.CAChain == b.CAChain && a.Roots == b.Roots && bytes.Equal(as.CAKey, bs.CAKey) && bytes.Equal(as.OPAQUE, bs.OPAQUE) && maps.Equal(a.Cross, b.Cross)
}

// rootsHold reports whether the PEM bundle lists the root with fingerprint fp.
func rootsHold(rootsPEM, fp string) bool {
	roots, err := pki.ParseCertsPEM([]byte(rootsPEM))
	if err != nil {
		return false
	}
	for _, r := range roots {
		if pki.FormatFingerprint(pki.FingerprintOf(r)) == fp {
			return true
		}
	}
	return false
}

// lockedSettings copies the settings under the lock SetEndpoint takes.
func (l *Listener) lockedSettings() Settings {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.settings
}

// joinCommandHint is how a listener is added to the cluster in a store.
const joinCommandHint = "stratum-listener init --join --kek FILE --store URL --data DIR --endpoint HOST:PORT"

// checkSharedIdentity runs as serve starts: when the store holds a cluster
// identity, this listener's keys must be the cluster's (or an older
// rotation of them, which it then catches up on); otherwise it refuses to
// serve and says why. A listener without a KEK on a store without an
// identity is a lone listener and serves as it always did.
func (l *Listener) checkSharedIdentity(ctx context.Context) error {
	kek, kpath, hasKEK, err := loadKEK(l.keys.Path)
	if err != nil {
		return err
	}
	rec, rev, err := l.cluster.SharedIdentity(ctx)
	if err != nil {
		return err
	}
	if rev == 0 {
		return nil
	}
	if !hasKEK {
		pub, _ := publicIdentity(rec)
		return fmt.Errorf("refusing to serve: the store holds the sealed keys of cluster %s and this listener has no key-encryption key (%s or the systemd credential %s); add it to the cluster with `%s`", pub.CAFingerprint, kpath, KEKFile, joinCommandHint)
	}
	pub, sec, err := openIdentity(kek, rec)
	if errors.Is(err, keyseal.ErrWrongKEK) {
		return fmt.Errorf("refusing to serve: %s is not the key-encryption key of the cluster in the store (%w); copy the cluster's key here, or add this listener with `%s`", kpath, err, joinCommandHint)
	}
	if err != nil {
		return fmt.Errorf("refusing to serve: the cluster identity in the store does not open: %w", err)
	}
	local, lsec, err := readLocalIdentity(l.keys.Path, l.lockedSettings())
	if err != nil {
		return fmt.Errorf("read this listener's keys: %w", err)
	}
	switch {
	case !bytes.Equal(lsec.OPAQUE, sec.OPAQUE):
		return fmt.Errorf("refusing to serve: this listener's OPAQUE keys differ from the cluster's in the store, so codes minted on other listeners would fail here; re-create it with `%s`", joinCommandHint)
	case local.TrustDomain != pub.TrustDomain || local.KSF != pub.KSF:
		return fmt.Errorf("refusing to serve: this listener's trust domain %s or key stretching differs from the cluster's (%s); re-create it with `%s`", local.TrustDomain, pub.TrustDomain, joinCommandHint)
	case local.CAFingerprint != pub.CAFingerprint && !rootsHold(pub.Roots, local.CAFingerprint):
		return fmt.Errorf("refusing to serve: this listener's CA (fingerprint %s) is not the cluster's (%s) nor one it rotated from; re-create it with `%s`", local.CAFingerprint, pub.CAFingerprint, joinCommandHint)
	}
	l.kek = &kek
	if err := l.cluster.AddEndpoints(ctx, l.lockedSettings().Endpoints); err != nil {
		return err
	}
	if !sameIdentity(local, lsec, pub, sec) {
		if err := writeLocalIdentity(l.keys.Path, pub, sec); err != nil {
			return fmt.Errorf("apply the cluster's keys: %w", err)
		}
		l.logger.Info("applied the cluster's keys from the store", "caFingerprint", pub.CAFingerprint, "was", local.CAFingerprint)
	}
	return nil
}

// ReloadKeys reads the cluster identity from the store and, when it
// changed (a rotation on another listener, or a root retired), writes it
// into the key directory and serves under it. It is the one path by which
// a change of the cluster's keys reaches a listener: the watch calls it,
// and so does every command that changes the keys, before and after.
func (l *Listener) ReloadKeys(ctx context.Context) error {
	if l.kek == nil {
		return nil
	}
	l.keysMu.Lock()
	defer l.keysMu.Unlock()
	return l.reloadKeysLocked(ctx)
}

func (l *Listener) reloadKeysLocked(ctx context.Context) error {
	rec, rev, err := l.cluster.SharedIdentity(ctx)
	if err != nil || rev == 0 {
		return err
	}
	pub, sec, err := openIdentity(*l.kek, rec)
	if err != nil {
		return fmt.Errorf("reload keys: %w", err)
	}
	if !bytes.Equal(sec.OPAQUE, l.opaqueRaw) {
		return errors.New("reload keys: the cluster's OPAQUE keys in the store changed; this listener keeps serving with its own: restart it to check them")
	}
	local, lsec, err := readLocalIdentity(l.keys.Path, l.lockedSettings())
	if err == nil && sameIdentity(local, lsec, pub, sec) {
		return nil
	}
	if err := writeLocalIdentity(l.keys.Path, pub, sec); err != nil {
		return fmt.Errorf("reload keys: %w", err)
	}
	if err := l.loadCA(); err != nil {
		return fmt.Errorf("reload keys: %w", err)
	}
	l.logger.Info("cluster keys reloaded from the store", "caFingerprint", pub.CAFingerprint)
	return nil
}

// publishLocked seals the key directory's identity into the store if the
// record is still at rev, with the event ev (if any) in the same
// transaction.
func (l *Listener) publishLocked(ctx context.Context, rev int64, actor, eventType string, fields func(pub sharedPublic) map[string]any) (bool, error) {
	pub, sec, err := readLocalIdentity(l.keys.Path, l.lockedSettings())
	if err != nil {
		return false, err
	}
	rec, err := sealIdentity(*l.kek, pub, sec)
	if err != nil {
		return false, err
	}
	var f map[string]any
	if fields != nil {
		f = fields(pub)
	}
	return l.cluster.PutSharedIdentity(ctx, rec, rev, eventType, actor, f)
}

// changeSharedKeys is how a command changes the keys of a cluster (a
// rotation; retiring a root): from the store's keys, change applied to the
// key directory, then back into the store under a compare-and-swap, so two
// listeners changing the keys at once cannot both win; the loser takes the
// winner's keys. The event is written with the keys, in one transaction,
// and every other listener applies the change through its watch.
func (l *Listener) changeSharedKeys(ctx context.Context, actor, eventType string, fields func(pub sharedPublic) map[string]any, change func() error) error {
	l.keysMu.Lock()
	defer l.keysMu.Unlock()
	if err := l.reloadKeysLocked(ctx); err != nil {
		return err
	}
	_, rev, err := l.cluster.SharedIdentity(ctx)
	if err != nil {
		return err
	}
	if err := change(); err != nil {
		// the key directory may be half changed: take the store's again
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		return errors.Join(err, l.reloadKeysLocked(rctx))
	}
	ok, err := l.publishLocked(ctx, rev, actor, eventType, fields)
	if err != nil || !ok {
		// Whatever the store holds now is the cluster's: take it.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if rerr := l.reloadKeysLocked(rctx); rerr != nil {
			return errors.Join(err, rerr)
		}
		if err == nil {
			err = errors.New("another listener changed the cluster's keys at the same moment; its change stands")
		}
		return err
	}
	return l.loadCA()
}

// rotateShared rotates the CA of a cluster (see changeSharedKeys).
func (l *Listener) rotateShared(ctx context.Context, actor string) (string, error) {
	err := l.changeSharedKeys(ctx, actor, cluster.EventCARotated,
		func(pub sharedPublic) map[string]any { return map[string]any{"caFingerprint": pub.CAFingerprint} },
		func() error {
			_, _, err := l.keys.Rotate(l.settings.TrustDomain, l.now())
			return err
		})
	if err != nil {
		return "", fmt.Errorf("rotate ca: %w", err)
	}
	_, fp := l.CA()
	return fp, nil
}

// watchKeys applies changes of the cluster identity as the store reports
// them, until ctx ends.
func (l *Listener) watchKeys(ctx context.Context) {
	if l.kek == nil {
		return
	}
	reload := func() {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := l.ReloadKeys(rctx); err != nil && ctx.Err() == nil {
			l.logger.Error("reload cluster keys", "err", err)
		}
	}
	for ctx.Err() == nil {
		ch, ok, err := l.cluster.WatchSharedIdentity(ctx)
		if !ok {
			return
		}
		if err == nil {
			reload() // a change while no watch ran
			for range ch {
				reload()
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
