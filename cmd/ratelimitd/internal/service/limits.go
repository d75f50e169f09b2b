package service

import (
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// checkSize refuses a call of more descriptors than MaxDescriptors, or a
// descriptor of more entries than MaxEntries, with InvalidArgument (400
// over HTTP), before anything is matched or counted.
func (s *Service) checkSize(descs []*rlcommon.RateLimitDescriptor) error {
	if len(descs) > s.opts.MaxDescriptors {
		return status.Errorf(codes.InvalidArgument, "%d descriptors in one call: at most %d (ratelimitd --max-descriptors)", len(descs), s.opts.MaxDescriptors)
	}
	for i, d := range descs {
		if n := len(d.GetEntries()); n > s.opts.MaxEntries {
			return status.Errorf(codes.InvalidArgument, "descriptor %d has %d entries: at most %d (ratelimitd --max-entries)", i, n, s.opts.MaxEntries)
		}
	}
	return nil
}
