package rtrs

import (
	"fmt"
	"log"
	"time"
)

// ServerConfig is the configuration of a server that every transport
// shares; a transport's own config (tcp.ServerConfig,
// rdmatr.ServerConfig) adds its handler and what only it needs. A zero
// field means the default named at the field.
type ServerConfig struct {
	// QueueDepth is the number of chunks of every session
	// (sess_queue_depth); default DefaultSessQueueDepth.
	QueueDepth int
	// ChunkSize is max_chunk_size, a power of two >= MinChunkSize;
	// default DefaultMaxChunkSize.
	ChunkSize int
	// MaxHdrSize is the room for user message + RTRS header in a chunk;
	// default DefaultMaxHdrSize. max_io_size = ChunkSize - MaxHdrSize.
	MaxHdrSize int
	// HeartbeatInterval and MissedHeartbeats: a path whose service
	// connection has been silent for more than MissedHeartbeats intervals
	// (the client's rule, ClientConfig) is closed, at most one interval
	// later; defaults HBInterval and HBMissedMax.
	HeartbeatInterval time.Duration
	MissedHeartbeats  int
	// Sessions is the session layer (limits, session and path rules,
	// release), shared with the server's other transports; nil: a table
	// of the server's own with default limits.
	Sessions *ServerTable
	// Logf receives a line for every connection refused and every path
	// closed, and why; default log.Printf.
	Logf func(format string, args ...any)
}

// Checked returns c with its defaults filled in, or an error (wrapping
// ErrOutOfRange) if it breaks the kernel server's module-parameter rules
// (CheckServerParams) or leaves no room for data in a chunk.
func (c ServerConfig) Checked() (ServerConfig, error) {
	if c.QueueDepth == 0 {
		c.QueueDepth = DefaultSessQueueDepth
	}
	if c.ChunkSize == 0 {
		c.ChunkSize = DefaultMaxChunkSize
	}
	if c.MaxHdrSize == 0 {
		c.MaxHdrSize = DefaultMaxHdrSize
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = HBInterval
	}
	if c.MissedHeartbeats == 0 {
		c.MissedHeartbeats = HBMissedMax
	}
	if c.Logf == nil {
		c.Logf = log.Printf
	}
	if err := CheckServerParams(c.QueueDepth, c.ChunkSize); err != nil {
		return c, err
	}
	if c.MaxHdrSize <= 0 || c.MaxHdrSize >= c.ChunkSize {
		return c, fmt.Errorf("max_hdr_size %d not in 1..%d: %w", c.MaxHdrSize, c.ChunkSize-1, ErrOutOfRange)
	}
	if c.HeartbeatInterval < 0 || c.MissedHeartbeats < 0 {
		return c, fmt.Errorf("heartbeats every %v, %d missed: %w", c.HeartbeatInterval, c.MissedHeartbeats, ErrOutOfRange)
	}
	return c, nil
}

// SilenceLimit is how long a path's service connection may stay silent:
// MissedHeartbeats+1 intervals.
func (c *ServerConfig) SilenceLimit() time.Duration {
	return c.HeartbeatInterval * time.Duration(c.MissedHeartbeats+1)
}
