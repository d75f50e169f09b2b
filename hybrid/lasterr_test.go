package hybrid

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
)

// The last error keeps what Redis said: a connection closed or a deadline
// met right after (Redis closes a connection that did not AUTH once it
// sent a command of many arguments) does not replace NOAUTH, WRONGPASS or
// a refused connection; a new error that says something does.
func TestLastErrorKeepsTheCause(t *testing.T) {
	noauth := errors.New("NOAUTH Authentication required.")
	for _, vagueErr := range []error{io.EOF, io.ErrUnexpectedEOF, context.DeadlineExceeded,
		fmt.Errorf("read: %w", syscall.ECONNRESET), fmt.Errorf("write: %w", net.ErrClosed)} {
		h := &health{}
		h.noteErr(noauth)
		h.noteErr(vagueErr)
		if got := h.lastErr.Load().err; got != noauth {
			t.Errorf("after %v: last error %v, want the NOAUTH before it", vagueErr, got)
		}
	}
	h := &health{}
	h.noteErr(io.EOF)
	h.noteErr(noauth)
	if got := h.lastErr.Load().err; got != noauth {
		t.Errorf("NOAUTH after EOF: last error %v", got)
	}
	wrongpass := errors.New("WRONGPASS invalid username-password pair")
	h.noteErr(wrongpass)
	if got := h.lastErr.Load().err; got != wrongpass {
		t.Errorf("a specific error replaces another: got %v", got)
	}
	h = &health{}
	h.noteErr(io.EOF)
	h.noteErr(context.DeadlineExceeded)
	if got := h.lastErr.Load().err; got != context.DeadlineExceeded {
		t.Errorf("a vague error replaces a vague one: got %v", got)
	}
}
