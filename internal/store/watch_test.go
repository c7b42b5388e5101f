package store

import (
	"context"
	"fmt"
	"testing"
)

// keys reports how many keys have watchers.
func (n *Notifier) keys() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.subs)
}

// A watch that ends leaves nothing of its key behind, and a change of a
// key wakes its watchers only: a listener watches one key per pending
// join, so thousands come and go.
func TestNotifierForgetsEndedWatches(t *testing.T) {
	var n Notifier
	ctx, cancel := context.WithCancel(context.Background())
	chans := make([]<-chan struct{}, 100)
	for i := range chans {
		ch, err := n.Watch(ctx, fmt.Sprintf("join/j%d", i))
		if err != nil {
			t.Fatal(err)
		}
		chans[i] = ch
	}
	other, err := n.Watch(context.Background(), "join/other")
	if err != nil {
		t.Fatal(err)
	}
	n.Notify([]Op{{Key: "join/j7"}})
	select {
	case <-chans[7]:
	default:
		t.Fatal("a change of join/j7 did not wake its watcher")
	}
	select {
	case <-chans[8]:
		t.Fatal("a change of join/j7 woke the watcher of join/j8")
	default:
	}
	cancel()
	for _, ch := range chans {
		for range ch { // drained until the end of the watch closes it
		}
	}
	if got := n.keys(); got != 1 {
		t.Fatalf("%d keys still watched after 100 of 101 watches ended, want 1", got)
	}
	select {
	case _, open := <-other:
		t.Fatalf("the watch still running was woken or closed (open %v)", open)
	default:
	}
}
