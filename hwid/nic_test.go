package hwid

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestClassifyLink(t *testing.T) {
	ether := func(name, bus string) netlink.LinkAttrs {
		return netlink.LinkAttrs{Name: name, EncapType: "ether", ParentDevBus: bus}
	}
	hasDevice := func(name string) bool { return name == "eth-sysfs" }
	tests := []struct {
		name         string
		link         netlink.Link
		hasDevice    func(string) bool
		wantPhysical bool
		wantDetail   string
	}{
		{"pci nic", &netlink.Device{LinkAttrs: ether("eno1", "pci")}, nil, true, "bus pci"},
		{"virtio nic", &netlink.Device{LinkAttrs: ether("eth0", "virtio")}, nil, true, "bus virtio"},
		{"usb nic", &netlink.Device{LinkAttrs: ether("enx0", "usb")}, nil, true, "bus usb"},
		{"old kernel, sysfs device", &netlink.Device{LinkAttrs: ether("eth-sysfs", "")}, hasDevice, true, "has /sys/class/net/eth-sysfs/device"},
		{"no bus, no sysfs device", &netlink.Device{LinkAttrs: ether("eth-nobus", "")}, hasDevice, false, "no bus behind it"},
		{"no bus, other namespace", &netlink.Device{LinkAttrs: ether("eth-sysfs", "")}, nil, false, "no bus behind it"},
		{"loopback", &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo", EncapType: "loopback", Flags: net.FlagLoopback}}, hasDevice, false, "loopback"},
		{"infiniband", &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "ib0", EncapType: "infiniband", ParentDevBus: "pci"}}, nil, false, "infiniband link, not Ethernet"},
		{"veth", &netlink.Veth{LinkAttrs: ether("veth0", "")}, hasDevice, false, "veth"},
		{"bridge", &netlink.Bridge{LinkAttrs: ether("br0", "")}, hasDevice, false, "bridge"},
		{"bond", &netlink.Bond{LinkAttrs: ether("bond0", "")}, hasDevice, false, "bond"},
		{"vlan", &netlink.Vlan{LinkAttrs: ether("eno1.10", "")}, hasDevice, false, "vlan"},
		{"tuntap", &netlink.Tuntap{LinkAttrs: ether("tap0", "")}, hasDevice, false, "tuntap"},
		{"ifb", &netlink.Ifb{LinkAttrs: ether("ifb0", "")}, hasDevice, false, "ifb"},
		{"dummy", &netlink.Dummy{LinkAttrs: ether("dummy0", "")}, hasDevice, false, "dummy"},
		{"macvlan", &netlink.Macvlan{LinkAttrs: ether("mv0", "")}, hasDevice, false, "macvlan"},
		// SR-IOV VFs and mlx5 representors are "device" links on a bus
		// too; they are real hardware functions, so they count.
		{"sr-iov vf", &netlink.Device{LinkAttrs: ether("enp3s0f0v0", "pci")}, nil, true, "bus pci"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			physical, detail := classifyLink(tt.link, tt.hasDevice)
			if physical != tt.wantPhysical || detail != tt.wantDetail {
				t.Errorf("classifyLink = %v, %q; want %v, %q", physical, detail, tt.wantPhysical, tt.wantDetail)
			}
		})
	}
}

func TestListLinksRetriesInterruptedDumps(t *testing.T) {
	lo := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo"}}
	boom := errors.New("netlink socket: boom")
	tests := []struct {
		name      string
		results   []error // one per call; after the last, calls succeed
		wantCalls int
		wantErr   error
	}{
		{"first try", nil, 1, nil},
		{"interrupted twice", []error{netlink.ErrDumpInterrupted, netlink.ErrDumpInterrupted}, 3, nil},
		{"always interrupted", slices.Repeat([]error{netlink.ErrDumpInterrupted}, linkDumpAttempts+1), linkDumpAttempts, netlink.ErrDumpInterrupted},
		{"other error, no retry", []error{boom}, 1, boom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			list := func() ([]netlink.Link, error) {
				calls++
				if calls <= len(tt.results) {
					// Interrupted dumps come with partial data; it must
					// not be used.
					return []netlink.Link{lo}, tt.results[calls-1]
				}
				return []netlink.Link{lo, lo}, nil
			}
			links, err := listLinks(context.Background(), list)
			if calls != tt.wantCalls {
				t.Errorf("calls = %d, want %d", calls, tt.wantCalls)
			}
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Errorf("err = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil || len(links) != 2 {
				t.Errorf("got %d links, %v; want the 2 of the complete dump", len(links), err)
			}
		})
	}
}

// addLink creates l through h. For kinds this kernel may lack it logs and
// returns false instead of failing.
func addLink(t *testing.T, h *netlink.Handle, l netlink.Link, optional bool) bool {
	t.Helper()
	err := h.LinkAdd(l)
	if err == nil {
		return true
	}
	if optional && errors.Is(err, unix.EOPNOTSUPP) {
		t.Logf("this kernel cannot create a %s link (%v); continuing without it", l.Type(), err)
		return false
	}
	t.Fatalf("create %s %s: %v", l.Type(), l.Attrs().Name, err)
	return false
}

func linkMAC(t *testing.T, h *netlink.Handle, name string) string {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	return l.Attrs().HardwareAddr.String()
}

// TestCollectMACsVirtualLinks builds the virtual links a host carries in a
// fresh namespace and checks none of them is taken for a NIC unless the
// operator names it.
func TestCollectMACsVirtualLinks(t *testing.T) {
	h := newTestNetns(t)
	addLink(t, h, &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "veth-a"}, PeerName: "veth-b"}, false)
	addLink(t, h, &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br-test"}}, false)
	vethA, err := h.LinkByName("veth-a")
	if err != nil {
		t.Fatal(err)
	}
	br, err := h.LinkByName("br-test")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetMaster(vethA, br); err != nil {
		t.Fatalf("enslave veth-a to br-test: %v", err)
	}
	addLink(t, h, &netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: "ifb-test"}}, false)
	virtual := []string{"lo", "veth-a", "veth-b", "br-test", "ifb-test"}
	if addLink(t, h, &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: "dummy-test"}}, true) {
		virtual = append(virtual, "dummy-test")
	}
	vethB, err := h.LinkByName("veth-b")
	if err != nil {
		t.Fatal(err)
	}
	if addLink(t, h, &netlink.Vlan{LinkAttrs: netlink.LinkAttrs{Name: "vlan-test", ParentIndex: vethB.Attrs().Index}, VlanId: 10}, true) {
		virtual = append(virtual, "vlan-test")
	}
	if addLink(t, h, &netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: "macvlan-test", ParentIndex: vethB.Attrs().Index}, Mode: netlink.MACVLAN_MODE_BRIDGE}, true) {
		virtual = append(virtual, "macvlan-test")
	}
	if addLink(t, h, netlink.NewLinkBond(netlink.LinkAttrs{Name: "bond-test"}), true) {
		virtual = append(virtual, "bond-test")
	}

	macA := linkMAC(t, h, "veth-a")
	if got := linkMAC(t, h, "br-test"); got != macA {
		t.Fatalf("precondition: the bridge's MAC %s is not its port's %s", got, macA)
	}

	collect := func(t *testing.T, include ...string) Report {
		t.Helper()
		r := Report{Sources: map[string]string{}}
		if err := collectMACs(context.Background(), Config{NetlinkHandle: h, IncludeInterfaces: include}, &r, discardLogger()); err != nil {
			t.Fatalf("collectMACs: %v", err)
		}
		return r
	}

	t.Run("none counted", func(t *testing.T) {
		r := collect(t)
		if len(r.Facts.MACs) != 0 || r.Sources[FactMACs] != "" {
			t.Errorf("MACs %q from %q, want none", r.Facts.MACs, r.Sources[FactMACs])
		}
		if !slices.Contains(r.Notes, "no MAC: no physical NIC found") {
			t.Errorf("notes %q lack the no-NIC note", r.Notes)
		}
		skipped := findNote(r.Notes, "not counted as NICs: ")
		for _, name := range virtual {
			if !strings.Contains(skipped, name+" (") {
				t.Errorf("skipped-links note %q does not name %s", skipped, name)
			}
		}
	})

	t.Run("operator includes veth-a", func(t *testing.T) {
		r := collect(t, "veth-a")
		if want := []string{macA}; !reflect.DeepEqual(r.Facts.MACs, want) {
			t.Errorf("MACs = %q, want %q (veth-a once, though br-test copies it)", r.Facts.MACs, want)
		}
		if want := "netlink: " + macA + " on veth-a (veth, operator-included, current address)"; r.Sources[FactMACs] != want {
			t.Errorf("source = %q, want %q", r.Sources[FactMACs], want)
		}
		if !slices.Contains(r.Notes, "veth-a (veth) counted as a NIC only because the operator included it") {
			t.Errorf("notes %q do not say veth-a was operator-included", r.Notes)
		}
	})

	t.Run("operator includes veth-a and its bridge", func(t *testing.T) {
		r := collect(t, "veth-a", "br-test")
		if want := []string{macA}; !reflect.DeepEqual(r.Facts.MACs, want) {
			t.Errorf("MACs = %q, want %q once", r.Facts.MACs, want)
		}
		src := r.Sources[FactMACs]
		if !strings.Contains(src, "veth-a (") || !strings.Contains(src, "br-test (") {
			t.Errorf("source %q should name both links sharing the MAC", src)
		}
	})

	t.Run("operator includes several", func(t *testing.T) {
		r := collect(t, "veth-b", "ifb-test", "veth-a")
		want := []string{macA, linkMAC(t, h, "veth-b"), linkMAC(t, h, "ifb-test")}
		slices.Sort(want)
		if !reflect.DeepEqual(r.Facts.MACs, want) {
			t.Errorf("MACs = %q, want %q sorted", r.Facts.MACs, want)
		}
	})

	t.Run("operator includes lo and a missing link", func(t *testing.T) {
		r := collect(t, "lo", "eth-missing", "eth-missing")
		if len(r.Facts.MACs) != 0 {
			t.Errorf("MACs = %q, want none", r.Facts.MACs)
		}
		// Netlink reports lo with no address or an all-zero one,
		// depending on the kernel; either way a note says why.
		lo := findNote(r.Notes, "lo (loopback)")
		if lo != "lo (loopback) has no MAC, not counted" && lo != "lo (loopback): MAC 00:00:00:00:00:00 is all zeros, not an identity" {
			t.Errorf("notes %q do not say why lo was not counted", r.Notes)
		}
		want := `operator-included interface "eth-missing" does not exist`
		if n := len(slices.DeleteFunc(slices.Clone(r.Notes), func(n string) bool { return n != want })); n != 1 {
			t.Errorf("notes %q hold %q %d times, want once", r.Notes, want, n)
		}
	})
}

// TestCollectMACsRootNamespace looks at the machine's own links: its NIC
// (eth0, virtio on the CI VM) is reported when a bus is behind it, and lo,
// ifb and any other virtual link are not.
func TestCollectMACsRootNamespace(t *testing.T) {
	r := Report{Sources: map[string]string{}}
	if err := collectMACs(context.Background(), Config{}, &r, discardLogger()); err != nil {
		t.Fatalf("collectMACs: %v", err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatalf("LinkList: %v", err)
	}

	eth0, err := netlink.LinkByName("eth0")
	if err != nil {
		t.Fatalf("this test expects the CI VM's eth0: %v", err)
	}
	a := eth0.Attrs()
	_, statErr := os.Stat(filepath.Join("/sys/class/net/eth0/device"))
	onBus := eth0.Type() == "device" && (a.ParentDevBus != "" || statErr == nil)
	mac := a.PermHWAddr
	if len(mac) == 0 {
		mac = a.HardwareAddr
	}
	t.Logf("eth0: type %s, bus %q, MAC %s; reported %q", eth0.Type(), a.ParentDevBus, mac, r.Facts.MACs)
	if got := slices.Contains(r.Facts.MACs, mac.String()); got != onBus {
		t.Errorf("eth0 (bus %q) reported = %v, want %v", a.ParentDevBus, got, onBus)
	}

	physical := map[string]bool{}
	for _, l := range links {
		if l.Type() == "device" && l.Attrs().ParentDevBus != "" {
			physical[l.Attrs().HardwareAddr.String()] = true
			physical[l.Attrs().PermHWAddr.String()] = true
		}
	}
	for _, l := range links {
		la := l.Attrs()
		if l.Type() == "device" && la.EncapType != "loopback" {
			continue
		}
		if m := la.HardwareAddr.String(); slices.Contains(r.Facts.MACs, m) && !physical[m] {
			t.Errorf("%s (%s) MAC %s reported as a NIC", la.Name, l.Type(), m)
		}
		if note := findNote(r.Notes, "not counted as NICs: "); !strings.HasSuffix(note, " more") && !strings.Contains(note, la.Name+" (") {
			t.Errorf("%s (%s) missing from the skipped-links note %q", la.Name, l.Type(), r.Notes)
		}
	}
}

func findNote(notes []string, prefix string) string {
	for _, n := range notes {
		if strings.HasPrefix(n, prefix) {
			return n
		}
	}
	return ""
}
