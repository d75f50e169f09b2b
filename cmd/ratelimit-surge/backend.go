package main

import (
	"context"
	"errors"
	"sync/atomic"
	"time"
)

var errOverloaded = errors.New("backend overloaded: no worker within the queue timeout")

// backend is the service behind the API with a capacity ceiling, the seed's
// matching service: a pool of workers, each serving one request at a time
// for a fixed service time. A request waits in a FIFO queue (the channel's
// blocked senders) for a worker, and is refused after queueTimeout. The
// API instances share one backend, as pods share one downstream service.
type backend struct {
	workers      chan struct{}
	service      time.Duration
	queueTimeout time.Duration

	served atomic.Int64 // requests a worker completed
}

func newBackend(workers int, service, queueTimeout time.Duration) *backend {
	return &backend{workers: make(chan struct{}, workers), service: service, queueTimeout: queueTimeout}
}

// do serves one request: it waits for a worker (at most queueTimeout), then
// holds it for the service time.
func (b *backend) do(ctx context.Context) error {
	wait := time.NewTimer(b.queueTimeout)
	defer wait.Stop()
	select {
	case b.workers <- struct{}{}:
	case <-wait.C:
		return errOverloaded
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-b.workers }()
	work := time.NewTimer(b.service)
	defer work.Stop()
	select {
	case <-work.C:
		b.served.Add(1)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
