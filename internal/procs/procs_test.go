package procs

import (
	"runtime"
	"testing"
)

func TestAddBlockingThread(t *testing.T) {
	n := runtime.GOMAXPROCS(0)
	release1 := AddBlockingThread()
	release2 := AddBlockingThread()
	if got := runtime.GOMAXPROCS(0); got != n+2 {
		t.Fatalf("GOMAXPROCS %d after two threads, want %d", got, n+2)
	}
	release1()
	release1() // once only
	if got := runtime.GOMAXPROCS(0); got != n+1 {
		t.Fatalf("GOMAXPROCS %d after releasing one thread twice, want %d", got, n+1)
	}
	release2()
	if got := runtime.GOMAXPROCS(0); got != n {
		t.Fatalf("GOMAXPROCS %d after releasing both, want %d", got, n)
	}
}
