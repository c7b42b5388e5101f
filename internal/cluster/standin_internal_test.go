package cluster

import (
	"encoding/json"
	"testing"

	"github.com/stratumjoin/stratum/internal/joincode"
	"github.com/stratumjoin/stratum/internal/pake"
)

// TestStandInsHaveTheirFamilysShape: an unknown locator's start decodes
// a record of its own family (code, token, key): the template's kind and
// locator are of that family and as long as a minted one's (a token id
// is jt_ and 52 symbols, a key id dnjoin- and 26), and it holds a record
// of a real record's size, so the unknown path reads what the found path
// of its shape reads.
func TestStandInsHaveTheirFamilysShape(t *testing.T) {
	tokenID := "jt_" + joincode.LowerBase32(make([]byte, 32))
	keyID, err := joincode.NewKeyID()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		locator string
		kind    string
	}{
		{"4F", KindCode},
		{"", KindCode},
		{tokenID, KindToken},
		{keyID, KindKey},
	} {
		var s Secret
		if err := json.Unmarshal(standInFor(tc.locator), &s); err != nil {
			t.Fatalf("%q: %v", tc.locator, err)
		}
		if s.Kind != tc.kind || len(s.Record) != pake.RecordSize {
			t.Errorf("%q: stand-in of kind %q with a %d-byte record, want %q and %d", tc.locator, s.Kind, len(s.Record), tc.kind, pake.RecordSize)
		}
		if tc.locator != "" && (joincode.LocatorKind(s.Locator) != joincode.LocatorKind(tc.locator) || len(s.Locator) != len(tc.locator)) {
			t.Errorf("%q: stand-in locator %q is not of its shape", tc.locator, s.Locator)
		}
	}
}
