package rls

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// maxJSONBody bounds the body of POST /json.
const maxJSONBody = 1 << 20

// JSONHandler serves POST /json: a RateLimitRequest in protojson in, the
// RateLimitResponse in protojson out. The HTTP status mirrors the answer:
// 200 OK, 429 OVER_LIMIT, 400 for a body that is not a valid request, 503
// when the backend failed and the failure mode is deny, 500 otherwise.
func (s *Service) JSONHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "use POST with a RateLimitRequest in JSON", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "reading body: "+err.Error(), http.StatusBadRequest)
			return
		}
		var req rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(body, &req); err != nil {
			http.Error(w, "invalid RateLimitRequest: "+err.Error(), http.StatusBadRequest)
			return
		}
		ctx := r.Context()
		if s.opts.Tracer != nil {
			ctx = s.prop.Extract(ctx, propagation.HeaderCarrier(r.Header))
		}
		resp, err := s.ShouldRateLimit(ctx, &req)
		if err != nil {
			code := http.StatusInternalServerError
			switch status.Code(err) {
			case codes.InvalidArgument:
				code = http.StatusBadRequest
			case codes.Unavailable:
				code = http.StatusServiceUnavailable
			}
			http.Error(w, status.Convert(err).Message(), code)
			return
		}
		out, err := marshalResponse(resp)
		if err != nil {
			http.Error(w, "encoding response: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		_, _ = w.Write(out)
	})
}

// remainingKey is how protojson names limit_remaining.
var remainingKey = []byte(`"limitRemaining":`)

// marshalResponse encodes resp as compact protojson with a newline, and with
// limitRemaining in every status even when it is 0 (protojson leaves out
// zero values, and a missing field reads as "unknown" exactly when nothing
// remains). It sets the zero values to 1 for encoding and then writes the 0
// back: each status has exactly one limitRemaining key, statuses come before
// any other field that could hold one (dynamic metadata), and a key inside a
// JSON string has its quotes escaped, so the n-th occurrence is the n-th
// status's.
func marshalResponse(resp *rlsv3.RateLimitResponse) ([]byte, error) {
	var zero []int
	for i, st := range resp.Statuses {
		if st.LimitRemaining == 0 {
			st.LimitRemaining = 1
			zero = append(zero, i)
		}
	}
	out, err := protojson.Marshal(resp)
	for _, i := range zero {
		resp.Statuses[i].LimitRemaining = 0
	}
	if err != nil {
		return nil, err
	}
	// protojson varies its whitespace on purpose; compact it so the
	// output is the same every time (for people and scripts alike).
	var compact bytes.Buffer
	if err := json.Compact(&compact, out); err != nil {
		return nil, err
	}
	b := compact.Bytes()
	at, n := 0, 0
	for _, i := range zero {
		for ; n <= i; n++ {
			k := bytes.Index(b[at:], remainingKey)
			if k < 0 {
				return nil, errors.New("limitRemaining missing from a status")
			}
			at += k + len(remainingKey)
		}
		if !bytes.HasPrefix(b[at:], []byte("1")) || (at+1 < len(b) && b[at+1] >= '0' && b[at+1] <= '9') {
			return nil, errors.New("unexpected limitRemaining value")
		}
		b[at] = '0'
	}
	return append(b, '\n'), nil
}
