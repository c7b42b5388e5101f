package hwid

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/stratumjoin/stratum/internal/identity"
	"github.com/vishvananda/netlink"
)

// linkDumpAttempts bounds the retries when the kernel flags a link dump as
// interrupted (links changed while it was being read).
const linkDumpAttempts = 5

// maxSkippedNamed caps how many skipped links the note names: a container
// host has hundreds of veths.
const maxSkippedNamed = 20

// collectMACs fills Facts.MACs with the MACs of physical NICs, plus those of
// the interfaces the operator included by name.
func collectMACs(ctx context.Context, cfg Config, r *Report, log *slog.Logger) error {
	list := netlink.LinkList
	var hasDevice func(name string) bool
	if cfg.NetlinkHandle != nil {
		list = cfg.NetlinkHandle.LinkList
	} else {
		hasDevice = sysfsHasDevice
	}
	links, err := listLinks(ctx, list)
	if err != nil {
		return err
	}

	included := make(map[string]bool, len(cfg.IncludeInterfaces))
	for _, name := range cfg.IncludeInterfaces {
		included[name] = true
	}
	found := map[string]bool{}
	sources := map[string][]string{} // MAC -> where it came from
	var skipped []string
	for _, l := range links {
		a := l.Attrs()
		found[a.Name] = true
		physical, detail := classifyLink(l, hasDevice)
		if !physical && !included[a.Name] {
			log.Debug("link not counted as a NIC", "link", a.Name, "why", detail)
			skipped = append(skipped, a.Name+" ("+detail+")")
			continue
		}
		addr, which := a.PermHWAddr, "permanent address"
		if len(addr) == 0 {
			addr, which = a.HardwareAddr, "current address"
		}
		if len(addr) == 0 {
			r.notef("%s (%s) has no MAC, not counted", a.Name, detail)
			continue
		}
		if len(addr) != 6 {
			r.notef("%s (%s): hardware address %q is not a 48-bit MAC, not counted", a.Name, detail, addr.String())
			continue
		}
		mac := addr.String()
		if reason := identity.PlaceholderReason(identity.KindMAC, mac); reason != "" {
			r.notef("%s (%s): MAC %s is %s, not an identity", a.Name, detail, mac, reason)
			continue
		}
		source := a.Name + " (" + detail + ", " + which + ")"
		if !physical {
			source = a.Name + " (" + detail + ", operator-included, " + which + ")"
			r.notef("%s (%s) counted as a NIC only because the operator included it", a.Name, detail)
		}
		sources[mac] = append(sources[mac], source)
	}

	for _, name := range cfg.IncludeInterfaces {
		if !found[name] {
			r.notef("operator-included interface %q does not exist", name)
			found[name] = true // one note per name
		}
	}
	if len(sources) == 0 {
		r.notef("no MAC: no physical NIC found")
	}
	if len(skipped) > 0 {
		slices.Sort(skipped)
		more := ""
		if len(skipped) > maxSkippedNamed {
			more = fmt.Sprintf(" and %d more", len(skipped)-maxSkippedNamed)
			skipped = skipped[:maxSkippedNamed]
		}
		r.notef("not counted as NICs: %s%s", strings.Join(skipped, ", "), more)
	}
	if len(sources) == 0 {
		return nil
	}

	macs := make([]string, 0, len(sources))
	for mac := range sources {
		macs = append(macs, mac)
	}
	slices.Sort(macs)
	parts := make([]string, 0, len(macs))
	for _, mac := range macs {
		parts = append(parts, mac+" on "+strings.Join(sources[mac], ", "))
	}
	r.Facts.MACs = macs
	r.Sources[FactMACs] = "netlink: " + strings.Join(parts, "; ")
	return nil
}

// classifyLink says whether l is a physical Ethernet NIC and, either way,
// what it is ("bus pci", "veth", "loopback", ...). hasDevice, when not nil,
// is asked about links that carry no parent bus (kernels before 5.15 do
// not report one).
func classifyLink(l netlink.Link, hasDevice func(name string) bool) (physical bool, detail string) {
	a := l.Attrs()
	switch {
	case a.EncapType == "loopback" || a.Flags&net.FlagLoopback != 0:
		return false, "loopback"
	case l.Type() != "device":
		// veth, bridge, bond, vlan, macvlan, tuntap, ifb, dummy, ...:
		// made by software, with made-up or copied MACs.
		return false, l.Type()
	case a.EncapType != "ether":
		return false, a.EncapType + " link, not Ethernet"
	case a.ParentDevBus != "":
		return true, "bus " + a.ParentDevBus
	case hasDevice != nil && hasDevice(a.Name):
		return true, "has /sys/class/net/" + a.Name + "/device"
	default:
		return false, "no bus behind it"
	}
}

func sysfsHasDevice(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/class/net", name, "device"))
	return err == nil
}

// listLinks calls list until the dump is not interrupted.
func listLinks(ctx context.Context, list func() ([]netlink.Link, error)) ([]netlink.Link, error) {
	var err error
	for range linkDumpAttempts {
		var links []netlink.Link
		links, err = list()
		if err == nil {
			return links, nil
		}
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			return nil, fmt.Errorf("list network links: %w", err)
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("list network links: %w", ctxErr)
		}
	}
	return nil, fmt.Errorf("list network links: interrupted %d times in a row: %w", linkDumpAttempts, err)
}
