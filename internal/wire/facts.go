package wire

// Facts are what a machine claims about itself in Proof. They are
// self-reported: the listener treats them as claims, never as attestation.
// Every string is already normalised by the agent (UUIDs upper case, MACs
// lower case colon-separated, placeholders dropped); the listener compares
// case-insensitively anyway.
type Facts struct {
	ProductUUID string   `cbor:"1,keyasint,omitempty" json:"productUuid,omitempty"`
	Serial      string   `cbor:"2,keyasint,omitempty" json:"serial,omitempty"`
	BoardSerial string   `cbor:"3,keyasint,omitempty" json:"boardSerial,omitempty"`
	Vendor      string   `cbor:"4,keyasint,omitempty" json:"vendor,omitempty"`
	ProductName string   `cbor:"5,keyasint,omitempty" json:"productName,omitempty"`
	MACs        []string `cbor:"6,keyasint,omitempty" json:"macs,omitempty"`
	GPUUUIDs    []string `cbor:"7,keyasint,omitempty" json:"gpuUuids,omitempty"`
	Hostname    string   `cbor:"8,keyasint,omitempty" json:"hostname,omitempty"`
}
