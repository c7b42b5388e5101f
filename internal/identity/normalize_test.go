package identity

import "testing"

func TestIsPlaceholder(t *testing.T) {
	tests := []struct {
		kind, value string
		want        bool
	}{
		// Product UUIDs.
		{KindProductUUID, "00000000-0000-0000-0000-000000000000", true},
		{KindProductUUID, "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF", true},
		{KindProductUUID, "ffffffff-ffff-ffff-ffff-ffffffffffff", true},
		{KindProductUUID, "03000200-0400-0500-0006-000700080009", true},
		{KindProductUUID, " 03000200-0400-0500-0006-000700080009\n", true},
		{KindProductUUID, "00020003-0004-0005-0006-000700080009", true},
		{KindProductUUID, "00000000000000000000000000000000", true},
		{KindProductUUID, "Not Settable", true},
		{KindProductUUID, "", true},
		{KindProductUUID, "4C4C4544-0037-5810-804A-B2C04F4B5133", false},
		{KindProductUUID, "00000000-0000-0000-0000-3CECEFA1B2C3", false}, // Supermicro: MAC in the last group
		{KindProductUUID, "3b6e1c5a-8f2d-11ee-a1c4-7cc2554d9e30", false},

		// Serials.
		{KindSerial, "To Be Filled By O.E.M.", true},
		{KindSerial, "to be filled by o.e.m.", true},
		{KindSerial, "TO BE FILLED BY OEM", true},
		{KindSerial, "To be filled by O.E.M", true},
		{KindSerial, "System Serial Number", true},
		{KindSerial, "Chassis Serial Number", true},
		{KindSerial, "Type2 - Board Serial Number", true},
		{KindSerial, "Default string", true},
		{KindSerial, "  Default   String ", true},
		{KindSerial, "Not Specified", true},
		{KindSerial, "Not Applicable", true},
		{KindSerial, "0123456789", true},
		{KindSerial, "None", true},
		{KindSerial, "N/A", true},
		{KindSerial, "OEM", true},
		{KindSerial, "Unknown", true},
		{KindSerial, "0", true},
		{KindSerial, "00000000", true},
		{KindSerial, "XXXXXXXXXX", true},
		{KindSerial, "..........", true},
		{KindSerial, "   ", true},
		{KindSerial, "", true},
		{KindSerial, "7XJ2KQ3", false},
		{KindSerial, "S452388X3A20165", false},
		{KindSerial, "1660423004819", false},
		{KindBoardSerial, "Base Board Serial Number", true},
		{KindBoardSerial, ".7XJ2KQ3.CNFCP0035B004H.", false},

		// Descriptive fields.
		{KindVendor, "System manufacturer", true},
		{KindVendor, "To Be Filled By O.E.M.", true},
		{KindVendor, "Dell Inc.", false},
		{KindVendor, "NVIDIA", false},
		{KindProductName, "System Product Name", true},
		{KindProductName, "Default string", true},
		{KindProductName, "PowerEdge R760", false},

		// MACs.
		{KindMAC, "00:00:00:00:00:00", true},
		{KindMAC, "FF:FF:FF:FF:FF:FF", true},
		{KindMAC, "ff-ff-ff-ff-ff-ff", true},
		{KindMAC, "01:00:5e:00:00:fb", true}, // multicast
		{KindMAC, "33:33:00:00:00:01", true}, // IPv6 multicast
		{KindMAC, "", true},
		{KindMAC, "02:fc:00:00:00:01", false}, // locally administered, still unicast
		{KindMAC, "3c:ec:ef:a1:b2:c3", false},
		{KindMAC, "not a mac", false}, // malformed, not a placeholder: format checks are the caller's

		// GPU UUIDs.
		{KindGPUUUID, "GPU-00000000-0000-0000-0000-000000000000", true},
		{KindGPUUUID, "GPU-ffffffff-ffff-ffff-ffff-ffffffffffff", true},
		{KindGPUUUID, "GPU-8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f", false},

		// Unknown kinds get the generic text rules.
		{"chassisSerial", "Chassis Serial Number", true},
		{"chassisSerial", "C8210LM35AB0042", false},
	}
	for _, tt := range tests {
		if got := IsPlaceholder(tt.kind, tt.value); got != tt.want {
			t.Errorf("IsPlaceholder(%q, %q) = %v, want %v", tt.kind, tt.value, got, tt.want)
		}
	}
}

func TestNormalizeMAC(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "AA:BB:CC:DD:EE:FF", want: "aa:bb:cc:dd:ee:ff"},
		{in: "aa:bb:cc:dd:ee:ff", want: "aa:bb:cc:dd:ee:ff"},
		{in: "AA-BB-CC-DD-EE-0F", want: "aa:bb:cc:dd:ee:0f"},
		{in: "aabb.ccdd.eeff", want: "aa:bb:cc:dd:ee:ff"},
		{in: "AABBCCDDEEFF", want: "aa:bb:cc:dd:ee:ff"},
		{in: " 02:fc:00:00:00:01\n", want: "02:fc:00:00:00:01"},
		{in: "", wantErr: true},
		{in: "aa:bb:cc:dd:ee", wantErr: true},
		{in: "aa:bb:cc:dd:ee:gg", wantErr: true},
		{in: "aabbccddeef", wantErr: true},
		{in: "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01", wantErr: true}, // InfiniBand, 20 bytes
		{in: "02:00:5e:10:00:00:00:01", wantErr: true},                                     // EUI-64
	}
	for _, tt := range tests {
		got, err := NormalizeMAC(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("NormalizeMAC(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestNormalizeUUID(t *testing.T) {
	tests := []struct{ in, want string }{
		{"4c4c4544-0037-5810-804a-b2c04f4b5133", "4C4C4544-0037-5810-804A-B2C04F4B5133"},
		{" 4C4C4544-0037-5810-804A-B2C04F4B5133\n", "4C4C4544-0037-5810-804A-B2C04F4B5133"},
		{"{4c4c4544-0037-5810-804a-b2c04f4b5133}", "4C4C4544-0037-5810-804A-B2C04F4B5133"},
		{"4c4c454400375810804ab2c04f4b5133", "4C4C4544-0037-5810-804A-B2C04F4B5133"},
		{"not-a-uuid", "NOT-A-UUID"}, // no validation: isUUID does that
		{"", ""},
	}
	for _, tt := range tests {
		if got := NormalizeUUID(tt.in); got != tt.want {
			t.Errorf("NormalizeUUID(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestNormalizeGPUUUID(t *testing.T) {
	tests := []struct {
		in, want string
		wantErr  bool
	}{
		{in: "GPU-8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f", want: "GPU-8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f"},
		{in: "gpu-8C8E2D4A-5B7F-1E3C-9D0A-6F1B2C3D4E5F", want: "GPU-8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f"},
		{in: " GPU-8c8e2d4a5b7f1e3c9d0a6f1b2c3d4e5f ", want: "GPU-8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f"},
		{in: "8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f", wantErr: true},
		{in: "MIG-8c8e2d4a-5b7f-1e3c-9d0a-6f1b2c3d4e5f", wantErr: true},
		{in: "GPU-", wantErr: true},
		{in: "GPU-8c8e2d4a", wantErr: true},
		{in: "", wantErr: true},
	}
	for _, tt := range tests {
		got, err := NormalizeGPUUUID(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("NormalizeGPUUUID(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestIsUUID(t *testing.T) {
	tests := []struct {
		in   string
		want bool
	}{
		{"4C4C4544-0037-5810-804A-B2C04F4B5133", true},
		{"4c4c4544-0037-5810-804a-b2c04f4b5133", true},
		{"4C4C4544-0037-5810-804A-B2C04F4B513", false},
		{"4C4C4544-0037-5810-804A-B2C04F4B51333", false},
		{"4C4C45440-037-5810-804A-B2C04F4B5133", false},
		{"4C4C4544-0037-5810-804A-B2C04F4B513G", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := IsUUID(tt.in); got != tt.want {
			t.Errorf("IsUUID(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
