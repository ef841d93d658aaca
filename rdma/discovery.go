package rdma

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Device discovery reads sysfs (/sys/class/infiniband) directly; it needs
// no device to be opened and no cgo.

// SysfsRoot is where discovery reads sysfs.
const SysfsRoot = "/sys"

// PortState is the logical state of a port (enum ib_port_state).
type PortState int

// Port states, as sysfs's ports/N/state reports them ("4: ACTIVE").
const (
	PortNop         PortState = 0
	PortDown        PortState = 1
	PortInit        PortState = 2
	PortArmed       PortState = 3
	PortActive      PortState = 4
	PortActiveDefer PortState = 5
)

var portStateNames = [...]string{"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"}

func (s PortState) String() string {
	if s >= 0 && int(s) < len(portStateNames) {
		return portStateNames[s]
	}
	return "PortState(" + strconv.Itoa(int(s)) + ")"
}

// Device is an RDMA device as sysfs describes it.
type Device struct {
	Name     string // e.g. "rxe0", "mlx5_0"
	NodeType string // e.g. "1: CA"
	NodeGUID string // e.g. "5254:00ff:fe12:3456"
	// Netdevs are the network interfaces of the whole device: the parent
	// of a software device (rxe, siw: the "parent" file) and the
	// interfaces of its PCI function (device/net/*).
	Netdevs []string
	Ports   []Port
}

// Port is a port of a Device.
type Port struct {
	Num       int       // from 1
	State     PortState // PortActive when usable
	PhysState string    // e.g. "LinkUp"
	LinkLayer string    // "Ethernet" (RoCE, iWARP) or "InfiniBand"
	// Netdevs are the network interfaces the port's GIDs belong to
	// (ports/N/gid_attrs/ndevs/*), or the device's Netdevs if the port
	// reports none.
	Netdevs []string
}

// Active reports whether the port is ACTIVE.
func (p Port) Active() bool { return p.State == PortActive }

// Devices lists the RDMA devices of the host, sorted by name. A host
// without RDMA has none (and no error).
func Devices() ([]Device, error) { return devicesAt(SysfsRoot) }

// devicesAt lists the devices under sysfs root root.
func devicesAt(root string) ([]Device, error) {
	dir := filepath.Join(root, "class", "infiniband")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("rdma: list devices: %w", err)
	}
	var devs []Device
	for _, e := range ents {
		d, err := readDevice(filepath.Join(dir, e.Name()), e.Name())
		if err != nil {
			return nil, err
		}
		devs = append(devs, d)
	}
	slices.SortFunc(devs, func(a, b Device) int { return strings.Compare(a.Name, b.Name) })
	return devs, nil
}

// readAttr reads a sysfs attribute, trimmed; "" if it cannot be read.
func readAttr(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func addUnique(list []string, s string) []string {
	if s == "" || slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}

func readDevice(dir, name string) (Device, error) {
	d := Device{
		Name:     name,
		NodeType: readAttr(filepath.Join(dir, "node_type")),
		NodeGUID: readAttr(filepath.Join(dir, "node_guid")),
	}
	d.Netdevs = addUnique(d.Netdevs, readAttr(filepath.Join(dir, "parent")))
	if ents, err := os.ReadDir(filepath.Join(dir, "device", "net")); err == nil {
		for _, e := range ents {
			d.Netdevs = addUnique(d.Netdevs, e.Name())
		}
	}
	ents, err := os.ReadDir(filepath.Join(dir, "ports"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return d, fmt.Errorf("rdma: device %s: %w", name, err)
	}
	for _, e := range ents {
		num, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		d.Ports = append(d.Ports, readPort(filepath.Join(dir, "ports", e.Name()), num, d.Netdevs))
	}
	slices.SortFunc(d.Ports, func(a, b Port) int { return a.Num - b.Num })
	return d, nil
}

// parseState parses "4: ACTIVE" (or a bare "4" or "ACTIVE").
func parseState(s string) PortState {
	num, _, _ := strings.Cut(s, ":")
	if n, err := strconv.Atoi(strings.TrimSpace(num)); err == nil {
		return PortState(n)
	}
	for i, name := range portStateNames {
		if strings.EqualFold(strings.TrimSpace(s), name) {
			return PortState(i)
		}
	}
	return PortNop
}

func readPort(dir string, num int, devNetdevs []string) Port {
	p := Port{
		Num:       num,
		State:     parseState(readAttr(filepath.Join(dir, "state"))),
		LinkLayer: readAttr(filepath.Join(dir, "link_layer")),
	}
	ps := readAttr(filepath.Join(dir, "phys_state"))
	if _, name, ok := strings.Cut(ps, ":"); ok {
		ps = strings.TrimSpace(name)
	}
	p.PhysState = ps
	// Unused GID entries fail to read (EINVAL); readAttr gives "" for them.
	ndevs := filepath.Join(dir, "gid_attrs", "ndevs")
	if ents, err := os.ReadDir(ndevs); err == nil {
		idx := make([]int, 0, len(ents))
		for _, e := range ents {
			if i, err := strconv.Atoi(e.Name()); err == nil {
				idx = append(idx, i)
			}
		}
		slices.Sort(idx)
		for _, i := range idx {
			p.Netdevs = addUnique(p.Netdevs, readAttr(filepath.Join(ndevs, strconv.Itoa(i))))
		}
	}
	if len(p.Netdevs) == 0 {
		p.Netdevs = slices.Clone(devNetdevs)
	}
	return p
}

// DeviceForNetdev returns the RDMA device and port that netdev (a network
// interface name) maps to, preferring an ACTIVE port.
func DeviceForNetdev(netdev string) (Device, Port, error) {
	devs, err := Devices()
	if err != nil {
		return Device{}, Port{}, err
	}
	return deviceForNetdev(devs, netdev)
}

func deviceForNetdev(devs []Device, netdev string) (Device, Port, error) {
	var found bool
	var fd Device
	var fp Port
	for _, d := range devs {
		for _, p := range d.Ports {
			if !slices.Contains(p.Netdevs, netdev) {
				continue
			}
			if p.Active() {
				return d, p, nil
			}
			if !found {
				found, fd, fp = true, d, p
			}
		}
	}
	if found {
		return fd, fp, nil
	}
	return Device{}, Port{}, fmt.Errorf("rdma: no RDMA device on network interface %s: %w", netdev, fs.ErrNotExist)
}

// DeviceForIP returns the RDMA device and port whose network interface has
// the local address ip, and that interface's name.
func DeviceForIP(ip netip.Addr) (Device, Port, string, error) {
	addrs, err := interfaceAddrs()
	if err != nil {
		return Device{}, Port{}, "", err
	}
	devs, err := Devices()
	if err != nil {
		return Device{}, Port{}, "", err
	}
	return deviceForIP(devs, addrs, ip)
}

// interfaceAddrs maps each network interface's name to its addresses.
func interfaceAddrs() (map[string][]netip.Addr, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("rdma: list network interfaces: %w", err)
	}
	m := make(map[string][]netip.Addr, len(ifs))
	for _, ifi := range ifs {
		as, err := ifi.Addrs()
		if err != nil {
			continue
		}
		for _, a := range as {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok {
					m[ifi.Name] = append(m[ifi.Name], ip.Unmap())
				}
			}
		}
	}
	return m, nil
}

func deviceForIP(devs []Device, addrs map[string][]netip.Addr, ip netip.Addr) (Device, Port, string, error) {
	ip = ip.Unmap().WithZone("")
	names := make([]string, 0, len(addrs))
	for name := range addrs {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !slices.Contains(addrs[name], ip) {
			continue
		}
		d, p, err := deviceForNetdev(devs, name)
		if err != nil {
			return Device{}, Port{}, name, fmt.Errorf("rdma: %s is on %s: %w", ip, name, err)
		}
		return d, p, name, nil
	}
	return Device{}, Port{}, "", fmt.Errorf("rdma: no network interface has address %s: %w", ip, fs.ErrNotExist)
}
