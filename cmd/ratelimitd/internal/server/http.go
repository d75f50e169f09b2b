package server

import (
	"encoding/json"
	"io"
	"net/http"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// maxBody bounds the body of a /v1/check request.
const maxBody = 1 << 20

// routes are the endpoints of the HTTP listener: /metrics too unless it
// is served apart (--metrics).
func (s *Server) routes(withMetrics bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/check", s.check)
	mux.HandleFunc("/json", s.check) // envoyproxy/ratelimit's path for the same thing
	s.addOps(mux, withMetrics)
	return mux
}

// addOps adds /healthz, /readyz, /healthcheck (envoyproxy/ratelimit's) and,
// withMetrics, /metrics to mux.
func (s *Server) addOps(mux *http.ServeMux, withMetrics bool) {
	if withMetrics {
		mux.Handle("/metrics", promhttp.HandlerFor(s.svc.Registry(), promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/readyz", s.ready)
	mux.HandleFunc("/healthcheck", s.healthcheck) // envoyproxy/ratelimit's
}

// ready answers 200 when the configuration is loaded and Redis answers,
// 503 with the reason otherwise (and from the start of a shutdown).
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		http.Error(w, "draining", http.StatusServiceUnavailable)
		return
	}
	if err := s.svc.Ready(r.Context()); err != nil {
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "ok\n")
}

// check is ShouldRateLimit over HTTP: the request and the response are
// Envoy's RateLimitRequest and RateLimitResponse in their JSON form
// (protojson: camelCase or snake_case names in, camelCase out). The status
// is 200 for OK and DenyStatus (429 by default) for OVER_LIMIT; the
// response headers of the decision are also set on the HTTP response.
func (s *Server) check(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		jsonError(w, http.StatusMethodNotAllowed, "use POST with a JSON RateLimitRequest")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		jsonError(w, http.StatusRequestEntityTooLarge, err.Error())
		return
	}
	var req pb.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		jsonError(w, http.StatusBadRequest, "not a RateLimitRequest: "+err.Error())
		return
	}
	resp, err := s.svc.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		st := status.Convert(err)
		jsonError(w, httpStatus(st.Code()), st.Message())
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		// Logged here, not sent: the client gets no internal error text.
		s.log.Error("cannot encode a response", "error", err)
		jsonError(w, http.StatusInternalServerError, "internal error")
		return
	}
	for _, h := range resp.ResponseHeadersToAdd {
		w.Header().Set(h.GetKey(), h.GetValue())
	}
	w.Header().Set("Content-Type", "application/json")
	code := http.StatusOK
	if resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
		code = s.opts.DenyStatus
	}
	w.WriteHeader(code)
	w.Write(out)
}

func httpStatus(c codes.Code) int {
	switch c {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.NotFound:
		return http.StatusNotFound
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.Canceled, codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

func jsonError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}
