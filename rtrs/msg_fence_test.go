package rtrs

import (
	"bytes"
	"testing"
)

func TestFenceRoundTrip(t *testing.T) {
	req := FenceReq{SessUUID: UUID{1, 2, 3, 15: 4}}
	b := make([]byte, FenceReqSize)
	if n, err := req.MarshalTo(b); err != nil || n != FenceReqSize || b[0] != 0x01 || b[1] != 0x75 || b[4] != 1 {
		t.Fatalf("fence_req % x, %d, %v", b, n, err)
	}
	var req2 FenceReq
	if err := req2.Unmarshal(b); err != nil || req2 != req {
		t.Fatalf("decoded %+v, %v", req2, err)
	}
	wantErr(t, req2.Unmarshal(b[:19]), ErrTruncated)
	rsp := FenceRsp{Errno: -1, SessUUID: req.SessUUID}
	if _, err := rsp.MarshalTo(b); err != nil {
		t.Fatal(err)
	}
	wantErr(t, req2.Unmarshal(b), ErrBadType)
	var rsp2 FenceRsp
	if err := rsp2.Unmarshal(b); err != nil || rsp2 != rsp {
		t.Fatalf("decoded %+v, %v", rsp2, err)
	}
	b[2], b[3] = 1, 0 // errno +1
	wantErr(t, rsp2.Unmarshal(b), ErrOutOfRange)
	_, err := (&FenceRsp{Errno: 5}).MarshalTo(b)
	wantErr(t, err, ErrOutOfRange)
}

func FuzzFenceReq(f *testing.F) {
	b := make([]byte, FenceReqSize)
	(&FenceReq{SessUUID: UUID{9}}).MarshalTo(b)
	f.Add(b)
	f.Add(b[:10])
	f.Fuzz(func(t *testing.T, b []byte) {
		var m FenceReq
		if m.Unmarshal(b) != nil {
			return
		}
		out := make([]byte, FenceReqSize)
		if _, err := m.MarshalTo(out); err != nil {
			t.Fatal(err)
		}
		var m2 FenceReq
		if err := m2.Unmarshal(out); err != nil || m2 != m {
			t.Fatalf("re-decode %+v != %+v (%v)", m2, m, err)
		}
	})
}

func FuzzFenceRsp(f *testing.F) {
	b := make([]byte, FenceRspSize)
	(&FenceRsp{Errno: -104, SessUUID: UUID{9}}).MarshalTo(b)
	f.Add(b)
	f.Add(bytes.Repeat([]byte{0xff}, 20))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m FenceRsp
		if m.Unmarshal(b) != nil {
			return
		}
		out := make([]byte, FenceRspSize)
		if _, err := m.MarshalTo(out); err != nil {
			t.Fatal(err)
		}
		var m2 FenceRsp
		if err := m2.Unmarshal(out); err != nil || m2 != m {
			t.Fatalf("re-decode %+v != %+v (%v)", m2, m, err)
		}
	})
}
