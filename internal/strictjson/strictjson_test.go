package strictjson

import (
	"errors"
	"testing"
)

type inner struct {
	Hostname string `json:"hostname"`
}

type doc struct {
	PoolID  string   `json:"poolId"`
	MaxUses *int     `json:"maxUses,omitempty"`
	Tags    []string `json:"tags"`
	Expect  *inner   `json:"expect,omitempty"`
	Items   []inner  `json:"items"`
}

func TestRefusals(t *testing.T) {
	for _, c := range []struct {
		in, kind, path string
	}{
		{`{"poolId":"a","poolId":"b"}`, Duplicate, "poolId"},
		{`{"POOLID":"a"}`, Unknown, "POOLID"},
		{`{"poolId":"a","extra":1}`, Unknown, "extra"},
		{`{"expect":{"hostname":"x","hostName":"y"}}`, Unknown, "expect.hostName"},
		{`{"expect":{"hostname":"x","hostname":"y"}}`, Duplicate, "expect.hostname"},
		{`{"tags":[1]}`, Type, "tags[0]"},
		{`{"items":[{"hostname":"a"},{"bogus":1}]}`, Unknown, "items[1].bogus"},
		{`{"maxUses":"3"}`, Type, "maxUses"},
		{`{"poolId":"a"} {}`, Syntax, ""},
		{`{"poolId":`, Syntax, ""},
		{`[]`, Type, ""},
		{`  `, Empty, ""},
	} {
		var d doc
		err := Unmarshal([]byte(c.in), &d)
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("%s: err %v, want a strictjson.Error", c.in, err)
			continue
		}
		if e.Kind != c.kind || e.Path != c.path {
			t.Errorf("%s: kind %q path %q, want %q %q (%v)", c.in, e.Kind, e.Path, c.kind, c.path, err)
		}
	}
}

func TestAccepts(t *testing.T) {
	var d doc
	if err := Unmarshal([]byte(`{"poolId":"a","maxUses":3,"tags":["x"],"expect":{"hostname":"h"}}`), &d); err != nil {
		t.Fatal(err)
	}
	if d.PoolID != "a" || *d.MaxUses != 3 || d.Tags[0] != "x" || d.Expect.Hostname != "h" {
		t.Fatalf("decoded %+v", d)
	}
}

func FuzzUnmarshal(f *testing.F) {
	for _, s := range []string{`{"poolId":"a"}`, `{"poolId":"a","poolId":"b"}`, `{"tags":[1,2]}`, `{"expect":{"hostname":1}}`, `[`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var d doc
		err := Unmarshal(b, &d)
		var e *Error
		if err != nil && !errors.As(err, &e) {
			t.Fatalf("error %v is not a strictjson.Error", err)
		}
	})
}
