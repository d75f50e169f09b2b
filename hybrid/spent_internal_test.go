package hybrid

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/hybridlimit/ratelimit"
)

// A word of a window spent names the limit, the window, what befell it
// and the key; anything else, or a word of another limit on the same
// prefix, is not read.
func TestParseSpent(t *testing.T) {
	p := newParams(ratelimit.Limit{Rate: 1, Period: time.Minute}, defaultConfig())
	msg := spentMsg(p, 42, opSpent, "user 7")
	if msg != "fw:1 60000000 42 s user 7" {
		t.Fatalf("word %q", msg)
	}
	if idx, op, k, ok := parseSpent(p, msg); !ok || idx != 42 || op != opSpent || k != "user 7" {
		t.Fatalf("parsed %d %q %q %v", idx, op, k, ok)
	}
	if _, op, _, ok := parseSpent(p, spentMsg(p, 42, opOpen, "k")); !ok || op != opOpen {
		t.Fatalf("open: %q %v", op, ok)
	}
	other := newParams(ratelimit.Limit{Rate: 2, Period: time.Minute}, defaultConfig())
	longer := newParams(ratelimit.Limit{Rate: 1, Period: time.Hour}, defaultConfig())
	for _, bad := range []string{
		"", "fw:1", "fw:1 60000000", "fw:1 60000000 42", "fw:1 60000000 42 s", "fw:1 60000000 42 s ",
		"fw:1 60000000 x s k", "fw:1 60000000 42 z k", "fw:1 6000000 42 s k", "tb:1 60000000 42 s k",
		spentMsg(other, 42, opSpent, "k"), spentMsg(longer, 42, opSpent, "k"),
		"fw:1 60000000 99999999999999999999 s k",
	} {
		if _, _, _, ok := parseSpent(p, bad); ok {
			t.Errorf("read %q", bad)
		}
	}
}

// The seen record's word of a window spent holds for that window only, is
// taken back by unspend and forgetSpent, and is never read as a decision
// recorded: a key said spent in the window before gets no counter for it.
func TestSeenSpent(t *testing.T) {
	s := newSeen(1024)
	h, other := s.hash("a"), s.hash("b")
	s.spend(h, 10)
	if !s.spent(h, 10) || s.spent(h, 11) || s.spent(h, 9) || s.spent(other, 10) {
		t.Fatal("spent: only key a in window 10")
	}
	s.unspend(h, 11)
	if !s.spent(h, 10) {
		t.Fatal("unspend of another window took it back")
	}
	s.unspend(h, 10)
	if s.spent(h, 10) {
		t.Fatal("unspend left it")
	}
	s.spend(h, 10)
	s.spend(other, 10)
	s.forgetSpent()
	if s.spent(h, 10) || s.spent(other, 10) {
		t.Fatal("forgetSpent left a word")
	}
	s.spend(h, 10)
	if _, ok := s.findFor(h, 11, 100, leaseAt, true); ok {
		t.Fatal("a word of the window before made a counter, as a decision recorded would")
	}
	if _, ok := s.findFor(h, 11, 100, leaseAt, true); !ok {
		t.Fatal("the key's second decision of window 11 makes its counter")
	}
	// A decision recorded is never read as a word.
	s.find(other, 10, 100, leaseAt)
	if s.spent(other, 10) {
		t.Fatal("a decision read as a word")
	}
	// A remainder noted as 0 is not a word either (its count is 1 or more).
	s.note(other, 10, 0, 100)
	if s.spent(other, 10) {
		t.Fatal("a remainder of 0 read as a word")
	}
}

// Only Redis refusing pub/sub for good turns the words off: not a lost
// connection, nor a server loading, busy or failing over.
func TestSpentRefusal(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{replyErr("NOPERM this user has no permissions to access one of the channels used as arguments"), true},
		{replyErr("ERR unknown command 'publish'"), true},
		{replyErr("LOADING Redis is loading the dataset in memory"), false},
		{replyErr("BUSY Redis is busy running a script"), false},
		{replyErr("CLUSTERDOWN The cluster is down"), false},
		{replyErr("READONLY You can't write against a read only replica."), false},
		{io.EOF, false},
		{context.DeadlineExceeded, false},
	} {
		if got := refusal(c.err); got != c.want {
			t.Errorf("refusal(%v) = %v; want %v", c.err, got, c.want)
		}
	}
}
