package pairing

import (
	"strings"
	"testing"
)

func TestDirsFor(t *testing.T) {
	for _, tt := range []struct {
		name       string
		goos, home string
		env        map[string]string
		data       string
		cache      string
		err        string
	}{
		{name: "linux default", goos: "linux", home: "/home/ada",
			data: "/home/ada/.local/share/metnos", cache: "/home/ada/.cache/metnos"},
		{name: "linux xdg", goos: "linux", home: "/home/ada",
			env:  map[string]string{"XDG_DATA_HOME": "/srv/d/", "XDG_CACHE_HOME": "/srv/c"},
			data: "/srv/d/metnos", cache: "/srv/c/metnos"},
		{name: "linux relative xdg is ignored", goos: "linux", home: "/home/ada",
			env:  map[string]string{"XDG_DATA_HOME": "data", "XDG_CACHE_HOME": "~/c"},
			data: "/home/ada/.local/share/metnos", cache: "/home/ada/.cache/metnos"},
		{name: "linux odd home", goos: "linux", home: "/home/Zoë O'Brien %h",
			data: "/home/Zoë O'Brien %h/.local/share/metnos", cache: "/home/Zoë O'Brien %h/.cache/metnos"},
		{name: "freebsd follows linux", goos: "freebsd", home: "/usr/home/ada",
			data: "/usr/home/ada/.local/share/metnos", cache: "/usr/home/ada/.cache/metnos"},
		{name: "linux no home", goos: "linux", home: "", err: "not an absolute path"},
		{name: "darwin", goos: "darwin", home: "/Users/ada",
			env:  map[string]string{"XDG_DATA_HOME": "/ignored"},
			data: "/Users/ada/Library/Application Support/metnos", cache: "/Users/ada/Library/Caches/metnos"},
		{name: "windows", goos: "windows",
			env:  map[string]string{"LOCALAPPDATA": `C:\Users\Ada\AppData\Local`},
			data: `C:\Users\Ada\AppData\Local\metnos`, cache: `C:\Users\Ada\AppData\Local\metnos`},
		{name: "windows trailing separator", goos: "windows",
			env:  map[string]string{"LOCALAPPDATA": `D:\Profiles\Ada\`},
			data: `D:\Profiles\Ada\metnos`, cache: `D:\Profiles\Ada\metnos`},
		{name: "windows unc", goos: "windows",
			env:  map[string]string{"LOCALAPPDATA": `\\srv\home\ada`},
			data: `\\srv\home\ada\metnos`, cache: `\\srv\home\ada\metnos`},
		{name: "windows unset", goos: "windows", err: "LOCALAPPDATA"},
		{name: "windows relative", goos: "windows", env: map[string]string{"LOCALAPPDATA": `AppData`}, err: "not an absolute path"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			d, err := DirsFor(tt.goos, func(k string) string { return tt.env[k] }, tt.home)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one saying %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Data != tt.data || d.Cache != tt.cache {
				t.Errorf("got data %q cache %q\nwant data %q cache %q", d.Data, d.Cache, tt.data, tt.cache)
			}
		})
	}
}
