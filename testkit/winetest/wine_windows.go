package winetest

import "golang.org/x/sys/windows"

// UnderWine reports whether this Windows process runs under Wine: Wine's
// ntdll.dll exports wine_get_version, Windows' does not.
func UnderWine() bool {
	return windows.NewLazySystemDLL("ntdll.dll").NewProc("wine_get_version").Find() == nil
}
