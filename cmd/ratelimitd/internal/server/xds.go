package server

import "time"

// XDSOptions configure the xDS configuration source (CONFIG_TYPE=GRPC_XDS_SOTW).
type XDSOptions struct {
	Server, NodeID, NodeMetadata string
	RetryInterval                time.Duration
	TLS                          bool
	TLSCA, TLSCert, TLSKey       string
	ForceStart                   bool
}
