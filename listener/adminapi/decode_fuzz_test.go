package adminapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stratumjoin/stratum/listener/registry"
)

// fuzzDecoder feeds arbitrary bodies to one request decoder: it must
// never panic, must reject what is not exactly one object of known fields,
// and what it accepts must survive encode-decode-encode unchanged and be
// checkable by the request's validation.
func fuzzDecoder[T any](f *testing.F, seeds []string, validate func(*T)) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var v T
		if err := decodeStrict(bytes.NewReader(body), &v); err != nil {
			if err.kind != kindInvalid || err.msg == "" {
				t.Fatalf("decode error %+v", err)
			}
			return
		}
		first, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var again T
		if err := decodeStrict(bytes.NewReader(first), &again); err != nil {
			t.Fatalf("re-decode %s: %v", first, err)
		}
		second, _ := json.Marshal(again)
		if !bytes.Equal(first, second) {
			t.Fatalf("round trip changed %s into %s", first, second)
		}
		validate(&v)
	})
}

func FuzzDecodeCreateJoinToken(f *testing.F) {
	fuzzDecoder(f, []string{
		`{"tenantId":"acme","poolId":"pool-a","ttlSeconds":600,"idempotencyKey":"k"}`,
		`{"tenantId":"acme","poolId":"pool-a","maxUses":3,"ttlSeconds":60,"expect":{"productUuid":"4c4c4544-0042","mac":"00:11:22:33:44:55"},"allowReclaim":true,"hosted":"kubernetes","idempotencyKey":"a:b/c"}`,
		`{"expect":{}}`, `{"maxUses":1.5}`, `{} {}`, `[]`, `null`, ``,
	}, func(r *CreateJoinTokenRequest) { r.validate() })
}

func FuzzDecodeListJoinTokens(f *testing.F) {
	fuzzDecoder(f, []string{
		`{"tenantId":"acme","poolId":"pool-a"}`,
		`{"tenantId":"acme","poolId":"pool-a","includeInactive":true,"limit":200,"cursor":"jt_0000000000000000000000000a"}`,
		`{"limit":"2"}`,
	}, func(r *ListJoinTokensRequest) { r.validate() })
}

func FuzzDecodeRevokeJoinToken(f *testing.F) {
	fuzzDecoder(f, []string{
		`{"tenantId":"acme","poolId":"pool-a","tokenId":"jt_0000000000000000000000000a"}`,
		`{"tokenId":7}`,
	}, func(r *RevokeJoinTokenRequest) { r.validate() })
}

func FuzzDecodeCreateJoinKey(f *testing.F) {
	reg, err := registry.Load(filepath.Join("testdata", "registry.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	fuzzDecoder(f, []string{
		`{"name":"ci-runner","networkID":"net-a","roleID":"role-ci","tags":["env:ci"],"autoAssignCIDRs":["100.100.0.0/22"],"expiresAt":"2099-01-01T00:00:00Z"}`,
		`{"name":"x","networkID":"net-a","roleID":null,"tags":null,"autoAssignCIDRs":null,"expiresAt":null}`,
		`{"autoAssignCIDRs":["a","b","c"]}`, `{"expiresAt":"yesterday"}`,
	}, func(r *CreateJoinKeyRequest) { r.validate(reg, "acme", time.Now()) })
}

func FuzzDecodeMintCode(f *testing.F) {
	fuzzDecoder(f, []string{
		`{"ttlSeconds":3600,"maxUses":0,"pool":"default","requireApproval":true,"expect":{"serial":"SN"},"allowReclaim":true,"hosted":"kubernetes"}`,
		`{}`, `{"pool":1}`,
	}, func(r *MintCodeRequest) { r.validate() })
}

func FuzzDecodeAPIKey(f *testing.F) {
	reg := registry.Default()
	fuzzDecoder(f, []string{
		`{"tenant":"default","name":"ci","grants":[{"action":"compute:join-tokens:create","resource":"compute-pool/*"}],"scopes":["join-keys:create"],"ttlSeconds":60}`,
		`{"grants":[{}]}`,
	}, func(r *APIKeyRequest) { r.validate(reg) })
}

// TestDecodeStrict pins the decoder's refusals and the field it names.
func TestDecodeStrict(t *testing.T) {
	cases := []struct {
		body, field string
	}{
		{`{"tenantId":"a","extra":1}`, "extra"},
		{`{"maxUses":"1"}`, "maxUses"},
		{`{"expect":{"mac":5}}`, "expect.mac"},
		{`{"expect":[]}`, "expect"},
		{`{"tenantId":"a"}{"tenantId":"b"}`, ""},
		{`{"tenantId":"a"`, ""},
		{`"x"`, ""},
		{``, ""},
	}
	for _, c := range cases {
		var req CreateJoinTokenRequest
		err := decodeStrict(strings.NewReader(c.body), &req)
		if err == nil {
			t.Errorf("%s: accepted", c.body)
			continue
		}
		if c.field != "" && (len(err.fields) != 1 || err.fields[0].path != c.field) {
			t.Errorf("%s: fields %+v, want %s", c.body, err.fields, c.field)
		}
	}
	// a body over the limit is refused, not read to the end
	w := httptest.NewRecorder()
	r := httptest.NewRequest("POST", "/", strings.NewReader(`{"tenantId":"`+strings.Repeat("a", maxBody)+`"}`))
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	var req CreateJoinTokenRequest
	if err := decodeStrict(r.Body, &req); err == nil || !strings.Contains(err.msg, "1 MiB") {
		t.Errorf("oversized body: %v", err)
	}
}
