package identity

import (
	"errors"
	"testing"
)

func TestPlaceholderReason(t *testing.T) {
	tests := []struct {
		kind, value string
		want        string // "" when value is a real identifier
	}{
		{KindProductUUID, "00000000-0000-0000-0000-000000000000", "all zeros"},
		{KindProductUUID, "ffffffff-ffff-ffff-ffff-ffffffffffff", "all F"},
		{KindProductUUID, "03000200-0400-0500-0006-000700080009", "a template UUID many boards ship"},
		{KindProductUUID, "030002000400050000060007000800090", ""}, // 33 digits: not the template
		{KindProductUUID, "03000200040005000006000700080009", "a template UUID many boards ship"},
		{KindProductUUID, "{00020003-0004-0005-0006-000700080009}", "a template UUID many boards ship"},
		{KindProductUUID, "--------", "a firmware placeholder"}, // only separators
		{KindProductUUID, "4C4C4544-0037-5810-804A-B2C04F4B5133", ""},
		{KindProductUUID, "00000000-0000-0000-0000-3CECEFA1B2C3", ""},

		// spellings without spaces, as the joinTokens API's serial pattern forces
		{KindSerial, "DefaultString", "a firmware placeholder"},
		{KindSerial, "Default_String", "a firmware placeholder"},
		{KindSerial, "Not-Specified", "a firmware placeholder"},
		{KindSerial, "To.Be.Filled.By.O.E.M.", "a firmware placeholder"},
		{KindSerial, "SystemSerialNumber", "a firmware placeholder"},
		{KindSerial, "Board-Serial-Number-1", "a firmware placeholder"},
		{KindSerial, "N/A", "a firmware placeholder"},
		{KindSerial, "0123456789", "a firmware placeholder"},
		{KindSerial, "7XJ2KQ3", ""},
		{KindSerial, "NA-7XJ2KQ3", ""},
		{KindVendor, "Dell Inc.", ""},

		{KindMAC, "00:00:00:00:00:00", "all zeros"},
		{KindMAC, "FF:FF:FF:FF:FF:FF", "the broadcast address"},
		{KindMAC, "01:00:5E:00:00:FB", "a multicast address"},
		{KindMAC, "02:AA:BB:CC:DD:01", ""},

		{KindGPUUUID, "GPU-00000000-0000-0000-0000-000000000000", "all zeros"},
		{KindGPUUUID, "gpu-FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF", "all F"},
		{KindGPUUUID, "GPU-8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f", ""},
	}
	for _, tt := range tests {
		if got := PlaceholderReason(tt.kind, tt.value); got != tt.want {
			t.Errorf("PlaceholderReason(%q, %q) = %q, want %q", tt.kind, tt.value, got, tt.want)
		}
		if got := IsPlaceholder(tt.kind, tt.value); got != (tt.want != "") {
			t.Errorf("IsPlaceholder(%q, %q) = %v", tt.kind, tt.value, got)
		}
	}
}

func TestNormalize(t *testing.T) {
	if got := NormalizeUUID(" {4c4c454400375810804ab2c04f4b5133} "); got != "4C4C4544-0037-5810-804A-B2C04F4B5133" {
		t.Errorf("NormalizeUUID = %q", got)
	}
	if got, err := NormalizeMAC("02-AA-BB-CC-DD-01"); err != nil || got != "02:aa:bb:cc:dd:01" {
		t.Errorf("NormalizeMAC = %q, %v", got, err)
	}
	if _, err := NormalizeMAC("02:aa:bb:cc:dd"); err == nil {
		t.Error("NormalizeMAC accepted five bytes")
	}
	if got, err := NormalizeGPUUUID("gpu-8C8E2D4A5B7F1E3C9D0A6F1B2C3D4E5F"); err != nil || got != "GPU-8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f" {
		t.Errorf("NormalizeGPUUUID = %q, %v", got, err)
	}
	if _, err := NormalizeGPUUUID("MIG-8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f"); !errors.Is(err, ErrNotGPUUUID) {
		t.Errorf("NormalizeGPUUUID(MIG-...) = %v, want ErrNotGPUUUID", err)
	}
	if IsUUID("4C4C4544-0037-5810-804A-B2C04F4B513") || !IsUUID("4c4c4544-0037-5810-804a-b2c04f4b5133") {
		t.Error("IsUUID")
	}
}
