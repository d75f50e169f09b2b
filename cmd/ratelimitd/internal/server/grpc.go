package server

import "google.golang.org/grpc"

// grpcOptions are the gRPC server's options: a call's message is bounded
// as /v1/check's body is.
func (s *Server) grpcOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(maxBody)}
}
