package rnbd_test

import (
	"context"
	"fmt"
	"time"

	"github.com/urnbd/urnbd/rnbd"
	"github.com/urnbd/urnbd/rtrs"
	"github.com/urnbd/urnbd/ublk"
)

// Map a remote device as a ublk block device: a session to the server
// over TCP (DialRDMA for RDMA, with the same configuration), then the
// device by its path on the server. It needs a server at 192.0.2.2:1234
// and the ublk_drv module, so it is compiled, not run.
func ExampleClient_Map() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := rnbd.DialTCP(ctx, rtrs.ClientConfig{SessName: "example", Policy: rtrs.MinInflight,
		Paths: []rtrs.PathAddr{{Dst: "192.0.2.2:1234"}}, MaxReconnectAttempts: -1})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	ctrl, err := ublk.OpenControl()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ctrl.Close()
	mode, _ := rnbd.ParseAccessMode("rw")
	dev, err := c.Map(ctx, ctrl, "disk.img", mode, rnbd.MapOptions{ID: -1})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(ublk.BlockPath(dev.UblkDevice().ID()))
	_ = dev.Unmap(ctx)
}
