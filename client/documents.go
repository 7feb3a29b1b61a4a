package client

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	leaseholdv1 "github.com/leasehold/leasehold/gen/leasehold/v1"
)

// InlineLimit is the largest document, in bytes, that SubmitFiles and
// ReadDocuments send inline: the coordinator's default limit of inline
// content per document. Larger files are sent by reference (source_uri
// "file://<absolute path>") for the renderer to read.
const InlineLimit = 256 << 10

// ReadDocuments builds one Document per path: the name is the file's base
// name, the content type comes from the extension (ContentType), the size is
// the file's size. A file of at most InlineLimit bytes is read and sent
// inline; a larger one is sent by reference with source_uri
// "file://<absolute path>" and no content.
func ReadDocuments(paths []string) ([]*leaseholdv1.Document, error) {
	docs := make([]*leaseholdv1.Document, 0, len(paths))
	for _, p := range paths {
		d, err := readDocument(p)
		if err != nil {
			return nil, err
		}
		docs = append(docs, d)
	}
	return docs, nil
}

func readDocument(path string) (*leaseholdv1.Document, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("reading document: %w", err)
	}
	if !info.Mode().IsRegular() {
		return nil, fmt.Errorf("reading document %s: not a regular file", path)
	}
	d := &leaseholdv1.Document{
		Name:        filepath.Base(path),
		ContentType: ContentType(path),
		SizeBytes:   info.Size(),
	}
	if info.Size() > InlineLimit {
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, fmt.Errorf("reading document %s: %w", path, err)
		}
		d.SourceUri = (&url.URL{Scheme: "file", Path: filepath.ToSlash(abs)}).String()
		return d, nil
	}
	content, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading document: %w", err)
	}
	d.Content = content
	d.SizeBytes = int64(len(content))
	return d, nil
}

// contentTypes maps common document extensions to MIME types.
var contentTypes = map[string]string{
	".pdf":  "application/pdf",
	".doc":  "application/msword",
	".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
	".xls":  "application/vnd.ms-excel",
	".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
	".ppt":  "application/vnd.ms-powerpoint",
	".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
	".odt":  "application/vnd.oasis.opendocument.text",
	".ods":  "application/vnd.oasis.opendocument.spreadsheet",
	".odp":  "application/vnd.oasis.opendocument.presentation",
	".rtf":  "application/rtf",
	".txt":  "text/plain",
	".md":   "text/markdown",
	".csv":  "text/csv",
	".html": "text/html",
	".htm":  "text/html",
	".png":  "image/png",
	".jpg":  "image/jpeg",
	".jpeg": "image/jpeg",
	".gif":  "image/gif",
	".svg":  "image/svg+xml",
	".tif":  "image/tiff",
	".tiff": "image/tiff",
}

// ContentType returns the MIME type for path's extension. An extension not
// in the table is returned itself, lower-cased (".xyz"), which the
// coordinator accepts as a content type; a path without an extension gets
// "application/octet-stream".
func ContentType(path string) string {
	ext := strings.ToLower(filepath.Ext(path))
	if ext == "" {
		return "application/octet-stream"
	}
	if t, ok := contentTypes[ext]; ok {
		return t
	}
	return ext
}
