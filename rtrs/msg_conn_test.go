package rtrs

import (
	"bytes"
	"strings"
	"testing"
)

func connReqExample() (ConnReq, []byte) {
	m := ConnReq{CID: 1, CIDNum: 9, ReconCnt: 2, FirstConn: true}
	for i := range m.SessUUID {
		m.SessUUID[i] = 0x11
		m.PathsUUID[i] = 0x22
	}
	var b []byte
	b = append(b, 0x00, 0x00, 0xbd, 0x1b, 0x00, 0x02, 0x01, 0x00, 0x09, 0x00, 0x02, 0x00)
	b = append(b, bytes.Repeat([]byte{0x11}, 16)...)
	b = append(b, bytes.Repeat([]byte{0x22}, 16)...)
	b = append(b, 0x01)
	b = append(b, make([]byte, 11)...)
	return m, b
}

func TestConnReq(t *testing.T) {
	m, want := connReqExample()
	if len(want) != 56 || m.Size() != 56 || ConnReqSize != 56 {
		t.Fatal("conn req size is not 56")
	}
	b := bytes.Repeat([]byte{0xEE}, 60)
	n, err := m.MarshalTo(b)
	mustNoErr(t, err)
	if n != 56 || !bytes.Equal(b[:56], want) || b[56] != 0xEE {
		t.Fatalf("marshal:\n got % x\nwant % x", b[:n], want)
	}
	var d ConnReq
	mustNoErr(t, d.Unmarshal(b)) // trailing bytes ignored
	if d != m {
		t.Fatalf("round trip %+v != %+v", d, m)
	}

	// Reserved bits, cma/ip version and minor version are ignored; bits 1
	// and 2 of byte 44 are urnbd's fence and auth, and with auth the
	// reserved tail is its data.
	x := bytes.Clone(want)
	x[0], x[1], x[4], x[44], x[50] = 0xAA, 0xBB, 0x07, 0xF2, 0x55
	mustNoErr(t, d.Unmarshal(x))
	m2 := m
	m2.FirstConn, m2.Fence = false, true
	if d != m2 {
		t.Fatalf("got %+v", d)
	}
	x[44] = 0xFE
	mustNoErr(t, d.Unmarshal(x))
	m2.Auth, m2.AuthData[5] = true, 0x55
	if d != m2 {
		t.Fatalf("got %+v", d)
	}
	m2.SetKeyID(KeyID{1, 2, 3, 4, 5, 6, 7, 8})
	_, err = m2.MarshalTo(b)
	mustNoErr(t, err)
	mustNoErr(t, d.Unmarshal(b))
	if d != m2 || d.KeyID() != (KeyID{1, 2, 3, 4, 5, 6, 7, 8}) || d.AuthData[8] != 0 {
		t.Fatalf("auth round trip %+v", d)
	}

	for _, c := range []struct {
		name string
		mod  func(b []byte) []byte
		err  error
	}{
		{"short", func(b []byte) []byte { return b[:55] }, ErrTruncated},
		{"empty", func(b []byte) []byte { return nil }, ErrTruncated},
		{"magic", func(b []byte) []byte { b[2] = 0xBC; return b }, ErrBadMagic},
		{"major 1", func(b []byte) []byte { b[5] = 1; return b }, ErrBadVersion},
		{"major 3", func(b []byte) []byte { b[5] = 3; return b }, ErrBadVersion},
		{"cid == cid_num", func(b []byte) []byte { b[6] = 9; return b }, ErrOutOfRange},
		{"cid_num 0", func(b []byte) []byte { b[6], b[8] = 0, 0; return b }, ErrOutOfRange},
		{"cid_num 4097", func(b []byte) []byte { b[8], b[9] = 0x01, 0x10; return b }, ErrOutOfRange},
	} {
		t.Run(c.name, func(t *testing.T) {
			var d ConnReq
			err := d.Unmarshal(c.mod(bytes.Clone(want)))
			wantErr(t, err, c.err)
			if d != (ConnReq{}) {
				t.Fatal("failed decode modified the message")
			}
		})
	}
	// cid_num 4096 is the largest accepted.
	x = bytes.Clone(want)
	x[8], x[9] = 0x00, 0x10
	mustNoErr(t, d.Unmarshal(x))

	_, err = m.MarshalTo(make([]byte, 55))
	wantErr(t, err, ErrShortBuffer)
	bad := m
	bad.CID = 9
	_, err = bad.MarshalTo(b)
	wantErr(t, err, ErrOutOfRange)
	if !strings.Contains(err.Error(), "cid 9 >= cid_num 9") {
		t.Fatalf("error text %q", err)
	}
}

func TestConnRsp(t *testing.T) {
	m := ConnRsp{QueueDepth: 512, MaxIOSize: 126976, MaxHdrSize: 4096, Flags: FlagNewRkey}
	want := hx(t, "bd 1b 00 02 00 00 00 02 00 f0 01 00 00 10 00 00 02 00 00 00")
	want = append(want, make([]byte, 36)...)
	b := make([]byte, 56)
	n, err := m.MarshalTo(b)
	mustNoErr(t, err)
	if n != 56 || !bytes.Equal(b, want) {
		t.Fatalf("marshal:\n got % x\nwant % x", b, want)
	}
	var d ConnRsp
	mustNoErr(t, d.Unmarshal(b))
	if d != m {
		t.Fatalf("round trip %+v", d)
	}
	if cs, err := d.ChunkSize(); err != nil || cs != 131072 || !d.NewRkey() {
		t.Fatalf("chunk size %d %v, new rkey %v", cs, err, d.NewRkey())
	}

	// Reject with -ECONNRESET: errno bytes 98 ff, other fields zero.
	rej := ConnRsp{Errno: -104}
	n, err = rej.MarshalTo(b)
	mustNoErr(t, err)
	wantRej := append(hx(t, "bd 1b 00 02 98 ff"), make([]byte, 50)...)
	if n != 56 || !bytes.Equal(b, wantRej) {
		t.Fatalf("reject:\n got % x\nwant % x", b, wantRej)
	}
	mustNoErr(t, d.Unmarshal(b))
	if d.Errno != -104 || d.QueueDepth != 0 {
		t.Fatalf("reject decoded as %+v", d)
	}

	wantErr(t, d.Unmarshal(want[:55]), ErrTruncated)
	x := bytes.Clone(want)
	x[0] = 0
	wantErr(t, d.Unmarshal(x), ErrBadMagic)
	x = bytes.Clone(want)
	x[3] = 1
	wantErr(t, d.Unmarshal(x), ErrBadVersion)
	x = bytes.Clone(want)
	x[2] = 0x07 // minor 7 is fine
	mustNoErr(t, d.Unmarshal(x))
	x = bytes.Clone(want)
	x[6], x[7] = 0, 0 // accept with queue depth 0
	wantErr(t, d.Unmarshal(x), ErrOutOfRange)
	_, err = (&ConnRsp{}).MarshalTo(b)
	wantErr(t, err, ErrOutOfRange)
	_, err = m.MarshalTo(b[:10])
	wantErr(t, err, ErrShortBuffer)

	big := ConnRsp{QueueDepth: 1, MaxIOSize: 0xFFFFFFFF, MaxHdrSize: 1}
	_, err = big.ChunkSize()
	wantErr(t, err, ErrOutOfRange)
}

func FuzzConnReq(f *testing.F) {
	_, b := connReqExample()
	f.Add(b)
	f.Add(b[:55])
	f.Add(make([]byte, 56))
	a, _ := connReqExample()
	a.Auth = true
	a.SetKeyID(KeyID{9, 8, 7})
	ab := make([]byte, ConnReqSize)
	a.MarshalTo(ab)
	f.Add(ab)
	f.Fuzz(func(t *testing.T, b []byte) {
		var m ConnReq
		if m.Unmarshal(b) != nil {
			return
		}
		out := make([]byte, ConnReqSize)
		if _, err := m.MarshalTo(out); err != nil {
			t.Fatalf("accepted %+v does not re-encode: %v", m, err)
		}
		var m2 ConnReq
		if err := m2.Unmarshal(out); err != nil || m2 != m {
			t.Fatalf("re-decode %+v != %+v (%v)", m2, m, err)
		}
	})
}

func FuzzConnRsp(f *testing.F) {
	var b [56]byte
	(&ConnRsp{QueueDepth: 512, MaxIOSize: 126976, MaxHdrSize: 4096, Flags: FlagNewRkey}).MarshalTo(b[:])
	f.Add(b[:])
	(&ConnRsp{Errno: -104}).MarshalTo(b[:])
	f.Add(b[:])
	var ab [56]byte
	(&ConnRsp{QueueDepth: 512, MaxIOSize: 126976, MaxHdrSize: 4096, Flags: FlagAuth | FlagFence, Nonce: NewNonce()}).MarshalTo(ab[:])
	f.Add(ab[:])
	f.Add(b[:20])
	f.Fuzz(func(t *testing.T, b []byte) {
		var m ConnRsp
		if m.Unmarshal(b) != nil {
			return
		}
		out := make([]byte, ConnRspSize)
		if _, err := m.MarshalTo(out); err != nil {
			t.Fatalf("accepted %+v does not re-encode: %v", m, err)
		}
		var m2 ConnRsp
		if err := m2.Unmarshal(out); err != nil || m2 != m {
			t.Fatalf("re-decode %+v != %+v (%v)", m2, m, err)
		}
	})
}
