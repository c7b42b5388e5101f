package wire

import "testing"

func TestEndpoint(t *testing.T) {
	tests := []struct{ in, want string }{
		{"join.example", "join.example:9444"},
		{"join.example:7000", "join.example:7000"},
		{"192.0.2.7", "192.0.2.7:9444"},
		{"::1", "[::1]:9444"},
		{"[::1]", "[::1]:9444"},
		{"[2001:db8::1]:7000", "[2001:db8::1]:7000"},
		{" join.example ", "join.example:9444"},
	}
	for _, tt := range tests {
		got, err := Endpoint(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("Endpoint(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", ":9444", "join.example:", "join.example:0", "join.example:99999", "join.example:http"} {
		if got, err := Endpoint(bad); err == nil {
			t.Errorf("Endpoint(%q) = %q, want an error", bad, got)
		}
	}
}
