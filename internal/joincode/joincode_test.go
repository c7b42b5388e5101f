package joincode

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestParseCodeFolding(t *testing.T) {
	c, err := NewCode("4F")
	if err != nil {
		t.Fatal(err)
	}
	canon := c.Display()
	raw := string(c.Password())
	folded := strings.NewReplacer("0", "o", "1", "l").Replace(strings.ToLower(raw))
	for _, in := range []string{canon, raw, strings.ToLower(canon), " " + raw[:3] + " " + raw[3:] + " ", folded} {
		got, err := Parse(in)
		if err != nil {
			t.Fatalf("Parse(%q): %v", in, err)
		}
		if string(got.Password()) != raw || got.Locator != "4F" || got.Kind != KindCode {
			t.Fatalf("Parse(%q) = %v %q", in, got, got.Password())
		}
	}
}

func TestCheckSymbolCatchesTypos(t *testing.T) {
	for i := 0; i < 200; i++ {
		c, err := NewCode(SelectorAt(i % Selectors))
		if err != nil {
			t.Fatal(err)
		}
		raw := []byte(c.Password())
		// every single substitution
		for pos := range raw {
			for _, sym := range []byte(Crockford) {
				if sym == raw[pos] {
					continue
				}
				typo := append([]byte(nil), raw...)
				typo[pos] = sym
				if _, err := ParseCode(string(typo)); !errors.Is(err, ErrCheckSymbol) {
					t.Fatalf("substitution %q -> %q not caught: %v", raw, typo, err)
				}
			}
		}
		// every adjacent transposition of distinct symbols
		for pos := 0; pos+1 < len(raw); pos++ {
			if raw[pos] == raw[pos+1] {
				continue
			}
			typo := append([]byte(nil), raw...)
			typo[pos], typo[pos+1] = typo[pos+1], typo[pos]
			if _, err := ParseCode(string(typo)); !errors.Is(err, ErrCheckSymbol) {
				t.Fatalf("transposition %q -> %q not caught: %v", raw, typo, err)
			}
		}
	}
}

func TestParseRejects(t *testing.T) {
	for _, in := range []string{"", "4F7K2", "4F7K2-Q9MXZ-TT", "4F7K2-Q9MXZ-U", "4F7K2-Q9MXZ-é", "bcjt_", "bcjt_jt_abc.def", "dnjoin-ABC-DEF", "bcjt_jt_" + strings.Repeat("u", 26) + "." + strings.Repeat("a", 32)} {
		if _, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) accepted", in)
		}
	}
}

// tokenAndKey mints a token with tokenID and a join key with a fresh id,
// which it returns too.
func tokenAndKey(t *testing.T, tokenID string) (tok, key Secret, keyID string) {
	t.Helper()
	tok, err := NewToken(tokenID)
	if err != nil {
		t.Fatal(err)
	}
	if keyID, err = NewKeyID(); err != nil {
		t.Fatal(err)
	}
	if key, err = NewKey(keyID); err != nil {
		t.Fatal(err)
	}
	return tok, key, keyID
}

func TestTokenAndKeyForms(t *testing.T) {
	id := "jt_" + strings.Repeat("0", 26)
	tok, key, kid := tokenAndKey(t, id)
	if tok.Kind != KindToken || tok.Locator != id || !strings.HasPrefix(string(tok.Password()), "bcjt_"+id+".") {
		t.Fatalf("token %v", tok)
	}
	if key.Kind != KindKey || key.Locator != kid || len(key.Password()) != len(kid)+1+52 {
		t.Fatalf("key %v %d", key, len(key.Password()))
	}
}

func TestSecretNeverFormats(t *testing.T) {
	c, _ := NewCode("ZZ")
	pw := string(c.Password())
	var sb strings.Builder
	logger := slog.New(slog.NewJSONHandler(&sb, &slog.HandlerOptions{Level: slog.LevelDebug}))
	logger.Debug("x", "secret", c)
	out := sb.String() + fmt.Sprintf("%v %+v %#v %s %q %x %d", c, c, c, c, c, c, c)
	if strings.Contains(out, pw) || strings.Contains(out, pw[2:]) || strings.Contains(out, fmt.Sprintf("%x", pw)) {
		t.Fatalf("secret leaked: %s", out)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"4F7K2-Q9MXZ-T", "bcjt_jt_00000000000000000000000000.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "dnjoin-P3RCTXN5LVFGBMJNYF2QHKWDOA-6YQKZ3VNB2XGJ4MEPLRT7WCSAHDUF5IO3QXBKZNYV2MJ4RLEHGTA", "", "oOiIlL"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := Parse(in)
		if err != nil {
			return
		}
		// a parsed secret re-parses to itself from its canonical form
		again, err := Parse(s.Display())
		if err != nil || again.Locator != s.Locator || string(again.Password()) != string(s.Password()) {
			t.Fatalf("round trip of %q: %v", in, err)
		}
		if !strings.HasPrefix(string(s.Password()), s.Locator) && s.Kind != KindToken {
			t.Fatalf("locator %q not a prefix", s.Locator)
		}
	})
}

// Every locator a parsed secret carries has its kind's shape, and nothing
// else does: the listener decides by the shape how a start is counted.
func TestLocatorKind(t *testing.T) {
	code, err := NewCode("4F")
	if err != nil {
		t.Fatal(err)
	}
	tok, key, _ := tokenAndKey(t, "jt_"+strings.Repeat("a", 26))
	for _, s := range []Secret{code, tok, key} {
		parsed, err := Parse(s.Display())
		if err != nil {
			t.Fatal(err)
		}
		if got := LocatorKind(parsed.Locator); got != s.Kind {
			t.Errorf("LocatorKind(%q) = %v, want %v", parsed.Locator, got, s.Kind)
		}
	}
	for _, loc := range []string{"", "4", "4F7", "4f", "jt_", "jt_" + strings.Repeat("a", 25), "jt_" + strings.Repeat("A", 26), "dnjoin-" + strings.Repeat("A", 25), "dnjoin-" + strings.Repeat("a", 26), "bcjt_jt_" + strings.Repeat("a", 26)} {
		if got := LocatorKind(loc); got != 0 {
			t.Errorf("LocatorKind(%q) = %v, want none", loc, got)
		}
	}
}
