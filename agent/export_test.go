package agent

import (
	"context"
	"crypto"
	"crypto/rand"
	"io"
)

// RenewTime exposes renewTime to the external tests.
var RenewTime = renewTime

// OverdueWait exposes overdueWait to the external tests.
var OverdueWait = overdueWait

// Exchange runs the agent's side of a join over str, as Join does over
// its QUIC stream: exporter is the connection's channel binding and peer
// the listener's certificate chain (DER), key the node key.
func Exchange(ctx context.Context, str io.ReadWriter, exporter []byte, peer [][]byte, key crypto.Signer, cfg JoinConfig) (*Joined, error) {
	cfg.defaults()
	nonce := make([]byte, 32)
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return exchange(ctx, str, exporter, peer, key, &cfg, attemptClaim{nonce: nonce})
}

// WithBeforeSave returns cfg with f run before the credentials are written.
func WithBeforeSave(cfg JoinConfig, f func()) JoinConfig {
	cfg.beforeSave = f
	return cfg
}
