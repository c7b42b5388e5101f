package store

import "errors"

// ErrRefused marks a store that answered but refused this client: a
// client certificate it does not accept, a server certificate we do not
// trust, a wrong password. Retrying will not help; the configuration must
// change. A store that does not answer is not ErrRefused: it may come back.
var ErrRefused = errors.New("the store refused this client")
