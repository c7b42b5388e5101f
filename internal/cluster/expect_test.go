package cluster

import (
	"strings"
	"testing"

	"github.com/stratumjoin/stratum/internal/wire"
)

func TestExpectValidate(t *testing.T) {
	tests := []struct {
		name    string
		expect  *Expect
		field   string // "" with ok: no problem
		ok      bool
		message string // a part of the message
	}{
		{name: "no binding", expect: nil, ok: true},
		{name: "every field", expect: &Expect{ProductUUID: "4c4c4544-0037-5810-804a-b2c04f4b5133", Serial: "7XJ2KQ3", MAC: "3C:EC:EF:A1:B2:C3", GPUUUID: "GPU-8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f"}, ok: true},
		{name: "supermicro uuid with leading zeros", expect: &Expect{ProductUUID: "00000000-0000-0000-0000-3CECEFA1B2C3"}, ok: true},
		{name: "empty", expect: &Expect{}, field: "", message: "at least one identifier"},
		{name: "ek hash alone", expect: &Expect{EKHash: strings.Repeat("Ab", 32)}, ok: true},
		{name: "ek hash short", expect: &Expect{EKHash: "abcd"}, field: "ekHash", message: "64 hex digits"},
		{name: "uuid pattern", expect: &Expect{ProductUUID: "not-a-uuid"}, field: "productUuid", message: "SMBIOS product UUID"},
		{name: "uuid too short", expect: &Expect{ProductUUID: "4c4c"}, field: "productUuid", message: "8-64 hex digits"},
		{name: "uuid too long", expect: &Expect{ProductUUID: strings.Repeat("a", 65)}, field: "productUuid", message: "at most 64"},
		{name: "uuid all zeros", expect: &Expect{ProductUUID: "00000000-0000-0000-0000-000000000000"}, field: "productUuid", message: "all zeros"},
		{name: "uuid all F", expect: &Expect{ProductUUID: "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF"}, field: "productUuid", message: "all F"},
		{name: "uuid AMI template", expect: &Expect{ProductUUID: "03000200-0400-0500-0006-000700080009"}, field: "productUuid", message: "template UUID"},
		{name: "serial with a space", expect: &Expect{Serial: "7XJ2 KQ3"}, field: "serial", message: "no spaces"},
		{name: "serial too long", expect: &Expect{Serial: strings.Repeat("A", 129)}, field: "serial", message: "at most 128"},
		{name: "serial placeholder", expect: &Expect{Serial: "0123456789"}, field: "serial", message: "placeholder"},
		{name: "serial placeholder without spaces", expect: &Expect{Serial: "Default_String"}, field: "serial", message: "placeholder"},
		{name: "mac with dashes", expect: &Expect{MAC: "3c-ec-ef-a1-b2-c3"}, field: "mac", message: "colon-separated"},
		{name: "mac five bytes", expect: &Expect{MAC: "3c:ec:ef:a1:b2"}, field: "mac", message: "colon-separated"},
		{name: "mac zeros", expect: &Expect{MAC: "00:00:00:00:00:00"}, field: "mac", message: "all zeros"},
		{name: "mac broadcast", expect: &Expect{MAC: "FF:FF:FF:FF:FF:FF"}, field: "mac", message: "broadcast"},
		{name: "mac multicast", expect: &Expect{MAC: "01:00:5e:00:00:fb"}, field: "mac", message: "multicast"},
		{name: "gpu without prefix", expect: &Expect{GPUUUID: "8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f"}, field: "gpuUuid", message: `"GPU-"`},
		{name: "gpu zeros", expect: &Expect{GPUUUID: "GPU-00000000-0000-0000-0000-000000000000"}, field: "gpuUuid", message: "all zeros"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			probs := tt.expect.Validate()
			if tt.ok {
				if len(probs) != 0 {
					t.Fatalf("problems %+v, want none", probs)
				}
				return
			}
			if len(probs) != 1 || probs[0].Field != tt.field || !strings.Contains(probs[0].Message, tt.message) {
				t.Fatalf("problems %+v, want one for field %q mentioning %q", probs, tt.field, tt.message)
			}
		})
	}
}

func TestMismatchedField(t *testing.T) {
	dell := wire.Facts{
		ProductUUID: "4C4C4544-0037-5810-804A-B2C04F4B5133",
		Serial:      "7XJ2KQ3",
		MACs:        []string{"3c:ec:ef:a1:b2:c3", "3c:ec:ef:a1:b2:c4"},
		GPUUUIDs:    []string{"GPU-8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f", "GPU-9d9e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f"},
	}
	tests := []struct {
		name   string
		expect *Expect
		want   string
	}{
		{"no binding", nil, ""},
		{"uuid in lower case", &Expect{ProductUUID: "4c4c4544-0037-5810-804a-b2c04f4b5133"}, ""},
		{"uuid without dashes", &Expect{ProductUUID: "4c4c454400375810804ab2c04f4b5133"}, ""},
		{"other uuid", &Expect{ProductUUID: "3b6e1c5a-8f2d-11ee-a1c4-7cc2554d9e30"}, "productUuid"},
		{"uuid prefix only", &Expect{ProductUUID: "4C4C4544"}, "productUuid"},
		{"serial", &Expect{Serial: "7XJ2KQ3"}, ""},
		{"serial is exact", &Expect{Serial: "7xj2kq3"}, "serial"},
		{"second mac, upper case", &Expect{MAC: "3C:EC:EF:A1:B2:C4"}, ""},
		{"mac not reported", &Expect{MAC: "3c:ec:ef:a1:b2:c5"}, "mac"},
		{"second gpu, upper case", &Expect{GPUUUID: "GPU-9D9E2D4A-5B7F-1E3C-9D0A-6F1B2C3D4E5F"}, ""},
		{"gpu not reported", &Expect{GPUUUID: "GPU-0d9e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f"}, "gpuUuid"},
		{"every field must match", &Expect{ProductUUID: dell.ProductUUID, Serial: "1660423004819"}, "serial"},
	}
	for _, tt := range tests {
		if got := MismatchedField(tt.expect, dell); got != tt.want {
			t.Errorf("%s: MismatchedField = %q, want %q", tt.name, got, tt.want)
		}
	}
	if got := MismatchedField(&Expect{GPUUUID: "GPU-8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f"}, wire.Facts{}); got != "gpuUuid" {
		t.Errorf("a machine without GPUs matched a GPU pin: %q", got)
	}
}

func TestIdentityKey(t *testing.T) {
	tests := []struct {
		name  string
		facts wire.Facts
		want  string
	}{
		{"uuid first", wire.Facts{ProductUUID: "4c4c4544-0037-5810-804a-b2c04f4b5133", Serial: "7XJ2KQ3", MACs: []string{"3c:ec:ef:a1:b2:c3"}}, "uuid:4C4C4544-0037-5810-804A-B2C04F4B5133"},
		{"serial without uuid", wire.Facts{Serial: "7XJ2KQ3", MACs: []string{"3c:ec:ef:a1:b2:c3"}}, "serial:7XJ2KQ3"},
		{"mac set, sorted, deduplicated", wire.Facts{MACs: []string{"3C:EC:EF:A1:B2:C4", "3c:ec:ef:a1:b2:c3", "3c-ec-ef-a1-b2-c4"}}, "mac:3c:ec:ef:a1:b2:c3,3c:ec:ef:a1:b2:c4"},
		{"placeholder uuid falls to serial", wire.Facts{ProductUUID: "03000200-0400-0500-0006-000700080009", Serial: "7XJ2KQ3"}, "serial:7XJ2KQ3"},
		{"placeholder serial falls to macs", wire.Facts{ProductUUID: "00000000-0000-0000-0000-000000000000", Serial: "To Be Filled By O.E.M.", MACs: []string{"3c:ec:ef:a1:b2:c3", "00:00:00:00:00:00"}}, "mac:3c:ec:ef:a1:b2:c3"},
		{"nothing", wire.Facts{Hostname: "gpu-01", MACs: []string{"ff:ff:ff:ff:ff:ff", "junk"}}, ""},
	}
	for _, tt := range tests {
		if got := IdentityKey(tt.facts); got != tt.want {
			t.Errorf("%s: IdentityKey = %q, want %q", tt.name, got, tt.want)
		}
	}
}
