package server

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/reflection"
)

// grpcOptions are the gRPC server's options: a call's message is bounded
// as /v1/check's body is, and connections as grpcBounds says.
func (s *Server) grpcOptions() []grpc.ServerOption {
	return append([]grpc.ServerOption{grpc.MaxRecvMsgSize(maxBody)}, s.grpcBounds()...)
}

// reflect registers gRPC server reflection when asked (--grpc-reflection),
// so that grpcurl and other tools call the service without its protos.
func (s *Server) reflect() {
	if s.opts.GRPCReflection {
		reflection.Register(s.grpc)
	}
}
