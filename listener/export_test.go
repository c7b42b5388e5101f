package listener

// FlushProofFailures records every open window of failed proofs now, as
// the end of Run does.
func FlushProofFailures(l *Listener) { l.proofFailures.flush(l, true) }

// Hooks are the listener's test observation points.
type Hooks = hooks

// WithHooks returns cfg observed through h.
func WithHooks(cfg Config, h Hooks) Config {
	cfg.hooks = h
	return cfg
}
