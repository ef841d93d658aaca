package rnbd

import (
	"errors"
	"syscall"
	"testing"
)

func TestDialOptionsAndBlocks(t *testing.T) {
	o, err := applyDialOptions(nil)
	if err != nil || o.maxDevices != DefaultMaxDevices {
		t.Fatalf("defaults: %+v, %v", o, err)
	}
	for _, n := range []int{0, -1, MaxDevicesLimit + 1} {
		if _, err := applyDialOptions([]DialOption{WithMaxDevices(n)}); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("WithMaxDevices(%d): %v, want EINVAL", n, err)
		}
	}
	o, err = applyDialOptions([]DialOption{WithMaxDevices(2)})
	if err != nil || o.maxDevices != 2 {
		t.Fatalf("WithMaxDevices(2): %+v, %v", o, err)
	}
	b := newBlocks(o.maxDevices)
	b0, err0 := b.get()
	b1, err1 := b.get()
	if err0 != nil || err1 != nil || b0 == b1 {
		t.Fatalf("two blocks of two: %d %v, %d %v", b0, err0, b1, err1)
	}
	if _, err := b.get(); !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("a third block of two: %v, want ENOSPC", err)
	}
	b.put(b0)
	if got, err := b.get(); err != nil || got != b0 {
		t.Errorf("block after put: %d, %v; want %d", got, err, b0)
	}
}

func TestSetIODeviceID(t *testing.T) {
	m := IO{DeviceID: 1, Sector: 8, RW: MakeRW(OpWrite, FlagFUA), BiSize: 4096}
	b := make([]byte, IOSize)
	if _, err := m.MarshalTo(b); err != nil {
		t.Fatal(err)
	}
	setIODeviceID(b, 7)
	var got IO
	if err := got.Unmarshal(b); err != nil {
		t.Fatal(err)
	}
	want := m
	want.DeviceID = 7
	if got != want {
		t.Errorf("after setIODeviceID: %+v, want %+v", got, want)
	}
}
