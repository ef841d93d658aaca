package clientq

// Unfenced keeps a client queue's dead connections whose requests must not
// go again yet: the server may still have copies of them unread on the
// connection's path, and a copy that ran after its resend could overwrite
// a newer write. They go again (RequestQueue.FailOver) once the server
// has closed that path: the client asked it to (FenceReq, where the server
// answered FlagFence), or the path connected again (a server takes a
// path's sess_uuid anew only once the old path is closed). Queue thread
// only.
type Unfenced[C comparable] struct {
	conns []C
}

// Hold adds c.
func (u *Unfenced[C]) Hold(c C) { u.conns = append(u.conns, c) }

// Len returns the number of connections held.
func (u *Unfenced[C]) Len() int { return len(u.conns) }

// Release takes the held connections that match out and calls release for
// each, in the order they were held.
func (u *Unfenced[C]) Release(match func(C) bool, release func(C)) {
	kept := u.conns[:0]
	var out []C
	for _, c := range u.conns {
		if match(c) {
			out = append(out, c)
		} else {
			kept = append(kept, c)
		}
	}
	clear(u.conns[len(kept):])
	u.conns = kept
	for _, c := range out {
		release(c)
	}
}
