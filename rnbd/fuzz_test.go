package rnbd

import (
	"bytes"
	"testing"
)

// roundTrip is what every RNBD fuzz target checks: a message that decodes
// re-encodes without error to bytes that decode to the same value.
type codec[T any] interface {
	*T
	Unmarshal([]byte) error
	MarshalTo([]byte) (int, error)
	Size() int
}

func fuzzRoundTrip[T comparable, P codec[T]](t *testing.T, b []byte) {
	var m T
	if P(&m).Unmarshal(b) != nil {
		return
	}
	out := make([]byte, P(&m).Size())
	n, err := P(&m).MarshalTo(out)
	if err != nil || n != len(out) {
		t.Fatalf("accepted %+v does not re-encode: %d, %v", m, n, err)
	}
	var m2 T
	if err := P(&m2).Unmarshal(out); err != nil || m2 != m {
		t.Fatalf("re-decode %+v != %+v (%v)", m2, m, err)
	}
}

func seed[P interface{ MarshalTo([]byte) (int, error) }](f *testing.F, m P, size int) {
	b := make([]byte, size)
	if _, err := m.MarshalTo(b); err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add(b[:size-1])
}

func FuzzMsgHdr(f *testing.F) {
	seed(f, &MsgHdr{Type: MsgIO}, MsgHdrSize)
	f.Fuzz(func(t *testing.T, b []byte) {
		fuzzRoundTrip[MsgHdr](t, b)
		if typ, err := PeekType(b); err == nil && !typ.Known() {
			t.Fatalf("PeekType accepted %v", typ)
		}
	})
}

func FuzzSessInfo(f *testing.F) {
	seed(f, &SessInfo{Ver: 2}, SessInfoSize)
	f.Fuzz(func(t *testing.T, b []byte) { fuzzRoundTrip[SessInfo](t, b) })
}

func FuzzSessInfoRsp(f *testing.F) {
	seed(f, &SessInfoRsp{Ver: 2}, SessInfoRspSize)
	f.Fuzz(func(t *testing.T, b []byte) { fuzzRoundTrip[SessInfoRsp](t, b) })
}

func FuzzOpen(f *testing.F) {
	m := Open{AccessMode: AccessMigration}
	m.SetDevName("/dev/ram0")
	seed(f, &m, OpenSize)
	f.Fuzz(func(t *testing.T, b []byte) { fuzzRoundTrip[Open](t, b) })
}

func FuzzOpenRsp(f *testing.F) {
	m := openRspExample()
	seed(f, &m, OpenRspSize)
	f.Fuzz(func(t *testing.T, b []byte) { fuzzRoundTrip[OpenRsp](t, b) })
}

func FuzzClose(f *testing.F) {
	seed(f, &Close{DeviceID: 7}, CloseSize)
	f.Fuzz(func(t *testing.T, b []byte) { fuzzRoundTrip[Close](t, b) })
}

func FuzzIO(f *testing.F) {
	m := IO{DeviceID: 7, Sector: 0x1000, RW: MakeRW(OpWrite, FlagSync|FlagFUA), BiSize: 4096, Prio: 0x4003}
	seed(f, &m, IOSize)
	f.Add(bytes.Repeat([]byte{4, 0, 0, 0}, 6)) // 24-byte pre-prio message
	f.Fuzz(func(t *testing.T, b []byte) { fuzzRoundTrip[IO](t, b) })
}
