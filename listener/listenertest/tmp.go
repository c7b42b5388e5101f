package listenertest

import "os"

func mkdirTemp() (string, error) { return os.MkdirTemp("/tmp", "sj") }

func removeAll(dir string) { os.RemoveAll(dir) }
