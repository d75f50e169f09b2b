package server

import "google.golang.org/grpc"

// grpcOptions are the gRPC server's options: a call's message is bounded
// as /v1/check's body is, and connections as grpcBounds says.
func (s *Server) grpcOptions() []grpc.ServerOption {
	return append([]grpc.ServerOption{grpc.MaxRecvMsgSize(maxBody)}, s.grpcBounds()...)
}
