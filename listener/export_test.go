package listener

// FlushProofFailures records every open window of failed proofs now, as
// the end of Run does.
func FlushProofFailures(l *Listener) { l.proofFailures.flush(l, true) }
