// Package server runs ratelimitd: the Envoy RLS v3 gRPC server, the HTTP
// server (/v1/check, /metrics, /healthz, /readyz), the configuration
// watcher, and the orderly shutdown that drains them and gives every
// lease back. Every server runs in one errgroup; the first to fail, or the
// end of the context, stops them all.
package server
