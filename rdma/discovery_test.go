package rdma

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
)

// fakeSysfs builds a sysfs tree with:
//   - rxe0: soft-RoCE on veth0 (parent file, GID ndevs 0 and 1 valid, the
//     rest unreadable like the real EINVAL entries), port 1 ACTIVE;
//   - mlx5_0: a PCI device with device/net/ens1f0, two ports, port 1
//     DOWN with no GID netdevs, port 2 ACTIVE on ens1f1;
//   - ib0dev: InfiniBand, port 1 INIT.
func fakeSysfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	write := func(rel, data string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ib := "class/infiniband/"
	write(ib+"rxe0/parent", "veth0\n")
	write(ib+"rxe0/node_type", "1: CA\n")
	write(ib+"rxe0/node_guid", "5254:00ff:fe12:3456\n")
	write(ib+"rxe0/ports/1/state", "4: ACTIVE\n")
	write(ib+"rxe0/ports/1/phys_state", "5: LinkUp\n")
	write(ib+"rxe0/ports/1/link_layer", "Ethernet\n")
	write(ib+"rxe0/ports/1/gid_attrs/ndevs/0", "veth0\n")
	write(ib+"rxe0/ports/1/gid_attrs/ndevs/1", "veth0\n")
	// An unreadable entry (a directory reads as an error, like EINVAL).
	if err := os.MkdirAll(filepath.Join(root, ib+"rxe0/ports/1/gid_attrs/ndevs/2"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(ib+"rxe0/ports/1/gid_attrs/ndevs/10", "")

	write(ib+"mlx5_0/device/net/ens1f0/address", "00:11:22:33:44:55\n")
	write(ib+"mlx5_0/ports/1/state", "1: DOWN\n")
	write(ib+"mlx5_0/ports/1/phys_state", "3: Disabled\n")
	write(ib+"mlx5_0/ports/1/link_layer", "Ethernet\n")
	write(ib+"mlx5_0/ports/2/state", "4: ACTIVE\n")
	write(ib+"mlx5_0/ports/2/phys_state", "5: LinkUp\n")
	write(ib+"mlx5_0/ports/2/link_layer", "Ethernet\n")
	write(ib+"mlx5_0/ports/2/gid_attrs/ndevs/0", "ens1f1\n")
	write(ib+"mlx5_0/ports/2/gid_attrs/ndevs/3", "ens1f1.100\n")

	write(ib+"ib0dev/ports/1/state", "2: INIT\n")
	write(ib+"ib0dev/ports/1/link_layer", "InfiniBand\n")
	return root
}

func TestDevicesAt(t *testing.T) {
	devs, err := devicesAt(fakeSysfs(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 3 || devs[0].Name != "ib0dev" || devs[1].Name != "mlx5_0" || devs[2].Name != "rxe0" {
		t.Fatalf("devices %+v", devs)
	}
	rxe := devs[2]
	if rxe.NodeType != "1: CA" || rxe.NodeGUID != "5254:00ff:fe12:3456" {
		t.Errorf("rxe0 node %q %q", rxe.NodeType, rxe.NodeGUID)
	}
	if len(rxe.Netdevs) != 1 || rxe.Netdevs[0] != "veth0" {
		t.Errorf("rxe0 netdevs %v", rxe.Netdevs)
	}
	if len(rxe.Ports) != 1 {
		t.Fatalf("rxe0 ports %+v", rxe.Ports)
	}
	p := rxe.Ports[0]
	if p.Num != 1 || !p.Active() || p.State.String() != "ACTIVE" || p.PhysState != "LinkUp" ||
		p.LinkLayer != "Ethernet" || len(p.Netdevs) != 1 || p.Netdevs[0] != "veth0" {
		t.Errorf("rxe0 port %+v", p)
	}

	mlx := devs[1]
	if len(mlx.Ports) != 2 || mlx.Ports[0].Num != 1 || mlx.Ports[1].Num != 2 {
		t.Fatalf("mlx5_0 ports %+v", mlx.Ports)
	}
	// Port 1 has no GID netdev: it inherits the PCI function's.
	if p := mlx.Ports[0]; p.State != PortDown || p.Active() || len(p.Netdevs) != 1 || p.Netdevs[0] != "ens1f0" {
		t.Errorf("mlx5_0 port 1 %+v", p)
	}
	if p := mlx.Ports[1]; !p.Active() || len(p.Netdevs) != 2 || p.Netdevs[0] != "ens1f1" || p.Netdevs[1] != "ens1f1.100" {
		t.Errorf("mlx5_0 port 2 %+v", p)
	}
	if p := devs[0].Ports[0]; p.State != PortInit || p.LinkLayer != "InfiniBand" || len(p.Netdevs) != 0 {
		t.Errorf("ib0dev port 1 %+v", p)
	}
}

func TestDevicesAtNoRDMA(t *testing.T) {
	devs, err := devicesAt(t.TempDir())
	if err != nil || len(devs) != 0 {
		t.Fatalf("devices %v, %v", devs, err)
	}
}

func TestDeviceForIP(t *testing.T) {
	devs, err := devicesAt(fakeSysfs(t))
	if err != nil {
		t.Fatal(err)
	}
	addrs := map[string][]netip.Addr{
		"lo":         {netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")},
		"veth0":      {netip.MustParseAddr("192.0.2.1")},
		"ens1f1.100": {netip.MustParseAddr("2001:db8::5")},
		"ens1f0":     {netip.MustParseAddr("198.51.100.9")},
	}
	for _, c := range []struct {
		ip, dev, netdev string
		port            int
		active          bool
	}{
		{"192.0.2.1", "rxe0", "veth0", 1, true},
		{"::ffff:192.0.2.1", "rxe0", "veth0", 1, true},
		{"2001:db8::5", "mlx5_0", "ens1f1.100", 2, true},
		{"198.51.100.9", "mlx5_0", "ens1f0", 1, false},
	} {
		d, p, nd, err := deviceForIP(devs, addrs, netip.MustParseAddr(c.ip))
		if err != nil {
			t.Errorf("%s: %v", c.ip, err)
			continue
		}
		if d.Name != c.dev || nd != c.netdev || p.Num != c.port || p.Active() != c.active {
			t.Errorf("%s: %s port %d (%v) netdev %s; want %s port %d (%v) netdev %s",
				c.ip, d.Name, p.Num, p.State, nd, c.dev, c.port, c.active, c.netdev)
		}
	}
	if _, _, nd, err := deviceForIP(devs, addrs, netip.MustParseAddr("127.0.0.1")); !errors.Is(err, fs.ErrNotExist) || nd != "lo" {
		t.Errorf("127.0.0.1: %q %v", nd, err)
	}
	if _, _, _, err := deviceForIP(devs, addrs, netip.MustParseAddr("203.0.113.1")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("unknown address: %v", err)
	}
}

func TestParseState(t *testing.T) {
	for in, want := range map[string]PortState{
		"4: ACTIVE": PortActive, "1: DOWN": PortDown, "5: ACTIVE_DEFER": PortActiveDefer,
		"3": PortArmed, "INIT": PortInit, "": PortNop, "garbage": PortNop,
	} {
		if got := parseState(in); got != want {
			t.Errorf("parseState(%q) = %v, want %v", in, got, want)
		}
	}
	if s := PortState(9).String(); s != "PortState(9)" {
		t.Errorf("PortState(9) = %q", s)
	}
}
