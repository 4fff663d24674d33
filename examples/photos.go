package examples

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"
)

// Photo describes one generated photo.
type Photo struct {
	// Name is the file name, a plain base name such as "IMG_1001.jpg".
	Name string
	// Taken goes into the EXIF DateTimeOriginal and DateTime tags, to the
	// second, as a wall-clock reading (EXIF has no time zone), and becomes
	// the file's mtime. A zero Taken writes no EXIF segment at all.
	Taken time.Time
	// Seed varies the picture, so photos with different seeds have
	// different bytes. It also picks the EXIF byte order: little-endian
	// ("II") for an even seed, big-endian ("MM") for an odd one.
	Seed int64
}

// ErrNoEXIFDate is returned by ReadTaken for a JPEG without an EXIF date.
var ErrNoEXIFDate = errors.New("no EXIF date")

// Photo dimensions.
const (
	photoWidth  = 64
	photoHeight = 48
)

// EXIF tags and types used here.
const (
	tagDateTime         = 0x0132
	tagExifIFD          = 0x8769
	tagDateTimeOriginal = 0x9003
	typeASCII           = 2
	typeLong            = 4
	exifTimeLayout      = "2006:01:02 15:04:05"
)

// DemoPhotos returns eight photos taken in four months of two years
// (May and August 2023, January and July 2024), with mixed extension
// cases and both EXIF byte orders.
func DemoPhotos() []Photo {
	at := func(y int, m time.Month, d, hh, mm, ss int) time.Time {
		return time.Date(y, m, d, hh, mm, ss, 0, time.UTC)
	}
	return []Photo{
		{Name: "IMG_1001.jpg", Taken: at(2023, time.May, 14, 10, 15, 0), Seed: 1},
		{Name: "IMG_1002.jpg", Taken: at(2023, time.May, 20, 18, 42, 10), Seed: 2},
		{Name: "IMG_1003.JPG", Taken: at(2023, time.August, 3, 9, 5, 33), Seed: 3},
		{Name: "IMG_1004.jpeg", Taken: at(2023, time.August, 15, 21, 30, 0), Seed: 4},
		{Name: "IMG_2001.jpg", Taken: at(2024, time.January, 1, 0, 10, 0), Seed: 5},
		{Name: "IMG_2002.jpg", Taken: at(2024, time.January, 28, 14, 0, 45), Seed: 6},
		{Name: "vacanza_mare.jpg", Taken: at(2024, time.July, 4, 12, 0, 0), Seed: 7},
		{Name: "IMG_2004.jpg", Taken: at(2024, time.July, 19, 16, 20, 5), Seed: 8},
	}
}

// GeneratePhotos writes each photo into dir (created if missing) as a
// small real JPEG: a 64x48 gradient with stripes that depend on Seed,
// with an EXIF APP1 segment right after SOI carrying DateTimeOriginal and
// DateTime, and with Taken as its mtime. Existing files are overwritten.
func GeneratePhotos(dir string, photos []Photo) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, p := range photos {
		if p.Name == "" || p.Name == "." || p.Name == ".." || filepath.Base(p.Name) != p.Name {
			return fmt.Errorf("photo name %q is not a plain file name", p.Name)
		}
		var app1 []byte
		if !p.Taken.IsZero() {
			app1 = exifSegment(p.Seed%2 == 0, p.Taken, p.Taken)
		}
		data, err := jpegWithEXIF(p.Seed, app1)
		if err != nil {
			return fmt.Errorf("photo %s: %w", p.Name, err)
		}
		path := filepath.Join(dir, p.Name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return err
		}
		if !p.Taken.IsZero() {
			if err := os.Chtimes(path, p.Taken, p.Taken); err != nil {
				return err
			}
		}
	}
	return nil
}

// jpegWithEXIF encodes the picture for seed and inserts app1 (a whole
// APP1 segment, or nil for none) right after the SOI marker.
func jpegWithEXIF(seed int64, app1 []byte) ([]byte, error) {
	var buf bytes.Buffer
	if err := jpeg.Encode(&buf, picture(seed), &jpeg.Options{Quality: 85}); err != nil {
		return nil, err
	}
	enc := buf.Bytes()
	if len(enc) < 2 || enc[0] != 0xFF || enc[1] != 0xD8 {
		return nil, errors.New("encoder output does not start with SOI")
	}
	out := make([]byte, 0, len(enc)+len(app1))
	out = append(out, enc[:2]...)
	out = append(out, app1...)
	return append(out, enc[2:]...), nil
}

// picture is a diagonal gradient between two seeded colours, crossed by
// seeded stripes.
func picture(seed int64) image.Image {
	r := rand.New(rand.NewPCG(uint64(seed), 0x9E3779B97F4A7C15))
	rnd := func() float64 { return float64(r.IntN(256)) }
	c0 := [3]float64{rnd(), rnd(), rnd()}
	c1 := [3]float64{rnd(), rnd(), rnd()}
	period := 4 + r.IntN(9)
	slant := r.IntN(3)
	img := image.NewRGBA(image.Rect(0, 0, photoWidth, photoHeight))
	for y := 0; y < photoHeight; y++ {
		for x := 0; x < photoWidth; x++ {
			t := float64(x+y) / float64(photoWidth+photoHeight-2)
			var c [3]uint8
			for i := range c {
				v := c0[i]*(1-t) + c1[i]*t
				if ((x+slant*y)/period)%2 == 0 {
					v *= 0.7
				}
				c[i] = uint8(v)
			}
			img.SetRGBA(x, y, color.RGBA{c[0], c[1], c[2], 255})
		}
	}
	return img
}

// exifSegment builds an APP1 "Exif" segment with a TIFF header in the
// given byte order: IFD0 holds DateTime (if modified is not zero) and,
// if original is not zero, a pointer to an Exif sub-IFD holding
// DateTimeOriginal.
func exifSegment(little bool, original, modified time.Time) []byte {
	type entry struct {
		tag, typ     uint16
		count, value uint32
	}
	var order interface {
		binary.ByteOrder
		binary.AppendByteOrder
	} = binary.BigEndian
	mark := "MM"
	if little {
		order, mark = binary.LittleEndian, "II"
	}

	const ifd0At = 8
	var n0 int
	if !modified.IsZero() {
		n0++
	}
	if !original.IsZero() {
		n0++
	}
	subAt := ifd0At + 2 + 12*n0 + 4
	dataAt := subAt
	if !original.IsZero() {
		dataAt += 2 + 12 + 4
	}
	var ifd0, sub []entry
	var data []byte
	addTime := func(t time.Time) uint32 {
		at := uint32(dataAt + len(data))
		data = append(data, t.Format(exifTimeLayout)+"\x00"...)
		return at
	}
	if !modified.IsZero() {
		ifd0 = append(ifd0, entry{tagDateTime, typeASCII, 20, addTime(modified)})
	}
	if !original.IsZero() {
		ifd0 = append(ifd0, entry{tagExifIFD, typeLong, 1, uint32(subAt)})
		sub = append(sub, entry{tagDateTimeOriginal, typeASCII, 20, addTime(original)})
	}
	writeIFD := func(b []byte, es []entry) []byte {
		b = order.AppendUint16(b, uint16(len(es)))
		for _, e := range es {
			b = order.AppendUint16(b, e.tag)
			b = order.AppendUint16(b, e.typ)
			b = order.AppendUint32(b, e.count)
			b = order.AppendUint32(b, e.value)
		}
		return order.AppendUint32(b, 0) // no next IFD
	}

	tiff := append([]byte(mark), 0, 0)
	order.PutUint16(tiff[2:], 42)
	tiff = order.AppendUint32(tiff, ifd0At)
	tiff = writeIFD(tiff, ifd0)
	if len(sub) > 0 {
		tiff = writeIFD(tiff, sub)
	}
	tiff = append(tiff, data...)

	seg := []byte{0xFF, 0xE1, 0, 0}
	binary.BigEndian.PutUint16(seg[2:], uint16(2+6+len(tiff)))
	seg = append(seg, "Exif\x00\x00"...)
	return append(seg, tiff...)
}

// ReadTaken returns the date a JPEG was taken according to its EXIF:
// DateTimeOriginal (0x9003, in the Exif sub-IFD) if present and valid,
// else DateTime (0x0132, in IFD0). EXIF has no time zone: the reading is
// returned as a time in UTC. It is an independent Go reader, so tests can
// cross-check the Python one in organize_photos. A JPEG without either
// tag gives ErrNoEXIFDate.
func ReadTaken(path string) (time.Time, error) {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}, err
	}
	defer f.Close()
	tiff, err := findEXIF(bufio.NewReader(f))
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", path, err)
	}
	t, err := exifTime(tiff)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// findEXIF walks the JPEG markers up to SOS and returns the TIFF bytes of
// the first APP1 "Exif\0\0" segment.
func findEXIF(r *bufio.Reader) ([]byte, error) {
	var soi [2]byte
	if _, err := io.ReadFull(r, soi[:]); err != nil || soi != [2]byte{0xFF, 0xD8} {
		return nil, errors.New("not a JPEG")
	}
	for {
		b, err := r.ReadByte()
		if err != nil {
			return nil, ErrNoEXIFDate
		}
		if b != 0xFF {
			return nil, errors.New("JPEG marker expected")
		}
		m := byte(0xFF)
		for m == 0xFF {
			if m, err = r.ReadByte(); err != nil {
				return nil, ErrNoEXIFDate
			}
		}
		switch {
		case m == 0xD9 || m == 0xDA: // EOI, SOS
			return nil, ErrNoEXIFDate
		case m == 0x01 || (m >= 0xD0 && m <= 0xD7): // no length
			continue
		}
		var l [2]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return nil, ErrNoEXIFDate
		}
		n := int(binary.BigEndian.Uint16(l[:]))
		if n < 2 {
			return nil, errors.New("bad JPEG segment length")
		}
		body := make([]byte, n-2)
		if _, err := io.ReadFull(r, body); err != nil {
			return nil, ErrNoEXIFDate
		}
		if m == 0xE1 && bytes.HasPrefix(body, []byte("Exif\x00\x00")) {
			return body[6:], nil
		}
	}
}

// exifTime reads the date tags out of TIFF bytes.
func exifTime(tiff []byte) (time.Time, error) {
	if len(tiff) < 8 {
		return time.Time{}, ErrNoEXIFDate
	}
	var order binary.ByteOrder
	switch string(tiff[:2]) {
	case "II":
		order = binary.LittleEndian
	case "MM":
		order = binary.BigEndian
	default:
		return time.Time{}, errors.New("bad TIFF byte order")
	}
	if order.Uint16(tiff[2:]) != 42 {
		return time.Time{}, errors.New("bad TIFF magic")
	}
	// entries maps tag -> offset of the entry's 12 bytes.
	entries := func(at uint32) map[uint16]int {
		m := map[uint16]int{}
		if at < 8 || int64(at)+2 > int64(len(tiff)) {
			return m
		}
		n := int(order.Uint16(tiff[at:]))
		for i := 0; i < n; i++ {
			e := int(at) + 2 + 12*i
			if e+12 > len(tiff) {
				break
			}
			m[order.Uint16(tiff[e:])] = e
		}
		return m
	}
	ascii := func(e int) (time.Time, bool) {
		typ, count := order.Uint16(tiff[e+2:]), order.Uint32(tiff[e+4:])
		if typ != typeASCII || count == 0 {
			return time.Time{}, false
		}
		start := int64(e + 8)
		if count > 4 {
			start = int64(order.Uint32(tiff[e+8:]))
		}
		end := start + int64(count)
		if end > int64(len(tiff)) {
			return time.Time{}, false
		}
		s, _, _ := bytes.Cut(tiff[start:end], []byte{0})
		if len(s) > 19 {
			s = s[:19]
		}
		t, err := time.Parse(exifTimeLayout, string(s))
		return t, err == nil
	}

	ifd0 := entries(order.Uint32(tiff[4:]))
	if e, ok := ifd0[tagExifIFD]; ok && order.Uint32(tiff[e+4:]) == 1 {
		if e2, ok := entries(order.Uint32(tiff[e+8:]))[tagDateTimeOriginal]; ok {
			if t, ok := ascii(e2); ok {
				return t, nil
			}
		}
	}
	if e, ok := ifd0[tagDateTime]; ok {
		if t, ok := ascii(e); ok {
			return t, nil
		}
	}
	return time.Time{}, ErrNoEXIFDate
}
