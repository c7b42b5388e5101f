// Package procmem reads what a Linux process holds resident, from /proc:
// the benchmarks and tests that measure the listener's memory use it.
package procmem

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Status is a process's resident memory from /proc/PID/status, in KiB.
type Status struct {
	RSS  int // VmRSS: resident now
	HWM  int // VmHWM: the most resident at once
	Anon int // RssAnon: the process's own memory (heap, stacks)
	File int // RssFile: pages of the files it maps (its binary, a bbolt store)
}

// ReadStatus reads process pid's Status.
func ReadStatus(pid int) (Status, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Status{}, err
	}
	var st Status
	fields := map[string]*int{"VmRSS:": &st.RSS, "VmHWM:": &st.HWM, "RssAnon:": &st.Anon, "RssFile:": &st.File}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		if v, ok := fields[f[0]]; ok {
			if *v, err = strconv.Atoi(f[1]); err != nil {
				return Status{}, fmt.Errorf("status of %d: %w", pid, err)
			}
		}
	}
	return st, nil
}

// MappedKiB is the KiB process pid holds resident of its mappings of the
// file at path (0 for none).
func MappedKiB(pid int, path string) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return 0, err
	}
	total, in := 0, false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if !strings.HasSuffix(f[0], ":") {
			// a mapping's header: address range, perms, offset, dev, inode, path
			in = len(f) >= 6 && f[len(f)-1] == path
			continue
		}
		if in && f[0] == "Rss:" && len(f) >= 2 {
			kib, err := strconv.Atoi(f[1])
			if err != nil {
				return 0, fmt.Errorf("smaps of %d: %w", pid, err)
			}
			total += kib
		}
	}
	return total, nil
}
