package wire

import (
	"crypto/tls"
	"fmt"
)

// ExporterLabel is the TLS exporter label (RFC 9266) whose output binds
// a login to the QUIC connection carrying it.
const ExporterLabel = "EXPORTER-Channel-Binding"

// ExporterSize is the length of the exporter's output.
const ExporterSize = 32

// ContextLabel starts every OPAQUE AKE context.
const ContextLabel = "stratum-join/1"

// Exporter is the channel binding of a TLS (or QUIC) connection: both
// ends compute the same bytes, a relay that terminates TLS on both sides
// gets two different ones.
func Exporter(cs tls.ConnectionState) ([]byte, error) {
	e, err := cs.ExportKeyingMaterial(ExporterLabel, nil, ExporterSize)
	if err != nil {
		return nil, fmt.Errorf("tls exporter: %w", err)
	}
	return e, nil
}

// BindingContext is the OPAQUE AKE context for a connection whose
// exporter is exporter: ContextLabel followed by the exporter, so the
// two MACs of a login agree only when both ends saw the same connection.
func BindingContext(exporter []byte) []byte {
	return append([]byte(ContextLabel), exporter...)
}
