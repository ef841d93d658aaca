package rtrs

import (
	"errors"
	"syscall"
	"testing"
	"time"
)

func TestPathAddrString(t *testing.T) {
	if s := (PathAddr{Src: "10.0.0.1", Dst: "10.0.0.2:1234"}).String(); s != "10.0.0.1@10.0.0.2:1234" {
		t.Errorf("PathAddr.String = %q", s)
	}
	if s := (PathAddr{Dst: "h:1"}).String(); s != "h:1" {
		t.Errorf("PathAddr.String without Src = %q", s)
	}
}

func TestConnRspParams(t *testing.T) {
	p, err := (&ConnRsp{QueueDepth: 512, MaxIOSize: 126976, MaxHdrSize: 4096}).Params()
	mustNoErr(t, err)
	if p.ChunkSize != 131072 || p.QueueDepth != 512 || p.MaxIOSize != 126976 {
		t.Errorf("params %+v", p)
	}
	if _, err := p.Codec.IOReq(511, 100); err != nil {
		t.Errorf("codec of the params refuses buf id 511: %v", err)
	}
	mustNoErr(t, p.CheckRequest(&Request{Data: make([]byte, p.MaxIOSize), Usr: make([]byte, p.MaxHdrSize-RdmaReadHdrSize-SGDescSize)}))
	for _, r := range []*Request{{Data: make([]byte, p.MaxIOSize+1)}, {Usr: make([]byte, p.MaxHdrSize-RdmaReadHdrSize-SGDescSize+1)}} {
		if err := p.CheckRequest(r); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("CheckRequest of %d data, %d user bytes: %v, want EINVAL", len(r.Data), len(r.Usr), err)
		}
	}
	_, err = (&ConnRsp{QueueDepth: 512, MaxIOSize: 126976}).Params()
	wantErr(t, err, ErrOutOfRange)
	_, err = (&ConnRsp{QueueDepth: 1, MaxIOSize: 1 << 28, MaxHdrSize: 4096}).Params()
	wantErr(t, err, ErrOutOfRange)
}

func TestCheckClientSession(t *testing.T) {
	mustNoErr(t, CheckClientSession("s", 1, 2, -1))
	for _, tc := range []struct {
		paths, cids, recon int
	}{{0, 2, 0}, {MaxPathsNum + 1, 2, 0}, {1, 1, 0}, {1, MaxConnsPerPath + 1, 0}, {1, 2, -2}, {1, 2, 10000}} {
		if err := CheckClientSession("s", tc.paths, tc.cids, tc.recon); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%+v: %v, want EINVAL", tc, err)
		}
	}
	if err := CheckClientSession("", 1, 2, 0); err == nil {
		t.Error("empty session name accepted")
	}
	d, err := ClientConfig{SessName: "s", Paths: make([]PathAddr, 1), Queues: 3, AdminQueue: true, Timeout: time.Second}.Checked()
	mustNoErr(t, err)
	if d.Timeout != time.Second || d.ReconnectDelay != ReconnectBackoff || d.HeartbeatInterval != HBInterval || d.MissedHeartbeats != HBMissedMax {
		t.Errorf("defaults %+v", d)
	}
	if d.NumQueues() != 4 || d.CIDNum() != 5 {
		t.Errorf("3 queues and the admin queue: %d queues, %d cids; want 4, 5", d.NumQueues(), d.CIDNum())
	}
	for _, bad := range []ClientConfig{
		{SessName: "s", Paths: make([]PathAddr, 1), Queues: -1},
		{SessName: "s", Paths: make([]PathAddr, 1), Timeout: -time.Second},
		{SessName: "s", Paths: make([]PathAddr, 1), Queues: MaxConnsPerPath},
	} {
		if _, err := bad.Checked(); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%+v: %v, want EINVAL", bad, err)
		}
	}
}

func TestServerConfigChecked(t *testing.T) {
	c, err := ServerConfig{}.Checked()
	if err != nil || c.QueueDepth != DefaultSessQueueDepth || c.ChunkSize != DefaultMaxChunkSize ||
		c.MaxHdrSize != DefaultMaxHdrSize || c.HeartbeatInterval != HBInterval || c.MissedHeartbeats != HBMissedMax || c.Logf == nil {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	if got, want := c.SilenceLimit(), HBInterval*time.Duration(HBMissedMax+1); got != want {
		t.Errorf("SilenceLimit %v, want %v", got, want)
	}
	for _, bad := range []ServerConfig{
		{ChunkSize: 3000},                   // not a power of two
		{QueueDepth: MaxSessQueueDepth + 1}, // too deep
		{ChunkSize: 4096, MaxHdrSize: 4096}, // no room for data
		{MissedHeartbeats: -1},
	} {
		if _, err := bad.Checked(); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("Checked(%+v) = %v, want ErrOutOfRange", bad, err)
		}
	}
}
