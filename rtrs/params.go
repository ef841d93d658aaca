package rtrs

import (
	"fmt"
	"syscall"
)

// Params are the session parameters a server announced in its ConnRsp,
// checked and with what follows from them.
type Params struct {
	QueueDepth int
	MaxIOSize  int
	MaxHdrSize int
	// ChunkSize is MaxIOSize + MaxHdrSize.
	ChunkSize int
	Flags     uint32
	// Codec encodes and checks immediates for these parameters.
	Codec ImmCodec
}

// Params validates an accepting ConnRsp and derives the session
// parameters: the chunk size must fit the offset field of an immediate
// and the header room must not be empty. Errors wrap ErrOutOfRange (or the
// ImmCodec's error for a queue depth it cannot encode).
func (m *ConnRsp) Params() (Params, error) {
	chunk, err := m.ChunkSize()
	if err != nil {
		return Params{}, err
	}
	if m.MaxHdrSize == 0 || chunk > 1<<ImmPayloadBits {
		return Params{}, wireErr(ErrOutOfRange, "conn_rsp", "max_hdr_size %d, chunk size %d", m.MaxHdrSize, chunk)
	}
	codec, err := NewImmCodec(int(m.QueueDepth), int(chunk))
	if err != nil {
		return Params{}, fmt.Errorf("rtrs conn_rsp: %w", err)
	}
	return Params{
		QueueDepth: int(m.QueueDepth),
		MaxIOSize:  int(m.MaxIOSize),
		MaxHdrSize: int(m.MaxHdrSize),
		ChunkSize:  int(chunk),
		Flags:      m.Flags,
		Codec:      codec,
	}, nil
}

// CheckRequest checks that r fits the session: at most MaxIOSize bytes of
// data, and a user message that leaves room for the largest RTRS header
// (a read's, with one descriptor) in MaxHdrSize. Errors wrap EINVAL.
func (p *Params) CheckRequest(r *Request) error {
	if len(r.Data) > p.MaxIOSize {
		return fmt.Errorf("request of %d bytes, max_io_size is %d: %w", len(r.Data), p.MaxIOSize, syscall.EINVAL)
	}
	if len(r.Usr)+RdmaReadHdrSize+SGDescSize > p.MaxHdrSize {
		return fmt.Errorf("user message of %d bytes too large for max_hdr_size %d: %w", len(r.Usr), p.MaxHdrSize, syscall.EINVAL)
	}
	return nil
}
