package server

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

const fuzzConfig = `
domain: f
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: exact
    rate_limit: {unit: second, requests_per_unit: 3, mode: exact, algorithm: sliding_log}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: free
    rate_limit: {unlimited: true}
  - key: never
    rate_limit: {unit: day, requests_per_unit: 0}
  - key: api
    rate_limits:
      - {unit: second, requests_per_unit: 2, algorithm: token_bucket}
      - {unit: minute, requests_per_unit: 10}
  - key: w
    value: 'pre*'
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 4}
`

// FuzzCheck: whatever the body of POST /v1/check, the answer is a status
// of the documented set, never a 500 or a panic, with a JSON body; an
// answered call has one status per descriptor and the HTTP status of its
// overall code. Seeded with the hostile cases of issue 18. It runs on the
// embedded Redis, with small bounds.
func FuzzCheck(f *testing.F) {
	dir := f.TempDir()
	cfg := filepath.Join(dir, "f.yaml")
	if err := os.WriteFile(cfg, []byte(fuzzConfig), 0o644); err != nil {
		f.Fatal(err)
	}
	s, err := New(Options{ConfigPaths: []string{cfg}, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", WatchInterval: -1,
		Logger: slog.New(slog.NewJSONHandler(io.Discard, nil)),
		Bounds: Bounds{MaxDescriptors: 8, MaxEntries: 4, MaxRuleLabels: 16}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.closeAll() })
	h := s.routes(true)
	for _, seed := range []string{
		`{"domain":"f","descriptors":[{"entries":[{"key":"a","value":"x"}]}]}`,
		`{"domain":"f","descriptors":[{"entries":[{"key":"a","value":"x"}]},{"entries":[{"key":"exact","value":"y"}]},{"entries":[{"key":"api","value":"k"}]}],"hits_addend":2}`,
		`{"domain":"f","descriptors":[` + strings.Repeat(`{"entries":[{"key":"a","value":"x"}]},`, 8) + `{"entries":[{"key":"a","value":"x"}]}]}`,
		`{"domain":"f","descriptors":[{"entries":[{"key":"a","value":"1"},{"key":"b","value":"2"},{"key":"c","value":"3"},{"key":"d","value":"4"},{"key":"e","value":"5"}]}]}`,
		`{"domain":"f","descriptors":[{"entries":[{"key":"new-key","value":"v"}],"limit":{"requests_per_unit":3,"unit":"MINUTE"}}]}`,
		`{"domain":"f","descriptors":[{"entries":[{"key":"a","value":"v"}],"limit":{"requests_per_unit":3,"unit":99}}]}`,
		`{"domain":"f","descriptors":[{"entries":[{"key":"detailed","value":"\u00e9\u0000|="}],"hitsAddend":"18446744073709551615"}]}`,
		`{"domain":"f","descriptors":[{"entries":[{"key":"a","value":"x"}],"isNegativeHits":true}]}`,
		`{"domain":"f","descriptors":[{"entries":[{"key":"w","value":"prefix"}]},{"entries":[{"key":"never","value":"x"}]},{"entries":[{"key":"free","value":"x"}]}]}`,
		`{"domain":"nope","descriptors":[{"entries":[{"key":"a","value":"x"}]}]}`,
		`{"domain":"","descriptors":[]}`,
		`{"domain":"f","descriptors":[{}]}`,
		`{"domain":`, ``, `null`, `[]`, `{"domain":"f","nope":1}`,
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, body string) {
		req := httptest.NewRequest(http.MethodPost, "/v1/check", strings.NewReader(body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		code, out := rec.Code, rec.Body.Bytes()
		if !json.Valid(out) {
			t.Fatalf("%d, not JSON: %q", code, out)
		}
		switch code {
		case http.StatusOK, http.StatusTooManyRequests:
		case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge:
			var e struct{ Error string }
			if json.Unmarshal(out, &e) != nil || e.Error == "" {
				t.Fatalf("%d without an error text: %q", code, out)
			}
			return
		default:
			t.Fatalf("status %d for %q: %s", code, body, out)
		}
		var in pb.RateLimitRequest
		if err := protojson.Unmarshal([]byte(body), &in); err != nil {
			t.Fatalf("answered %d a body that is not a request (%v): %q", code, err, body)
		}
		var resp pb.RateLimitResponse
		if err := protojson.Unmarshal(out, &resp); err != nil {
			t.Fatalf("a response that is not a RateLimitResponse: %v: %s", err, out)
		}
		if len(resp.Statuses) != len(in.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(in.Descriptors))
		}
		if over := resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT; over != (code == http.StatusTooManyRequests) {
			t.Fatalf("HTTP %d for overall code %v", code, resp.OverallCode)
		}
	})
}
