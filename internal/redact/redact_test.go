package redact

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"strings"
	"testing"
)

func TestConnHidesPasswordsAndTokens(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://user:s3cret@127.0.0.1:4222", "nats://user:xxxxx@127.0.0.1:4222"},
		{"nats://t0ken@127.0.0.1:4222", "nats://xxxxx@127.0.0.1:4222"},
		{"nats://a:p1@h1:4222,nats://t2@h2:4222,nats://h3:4222", "nats://a:xxxxx@h1:4222,nats://xxxxx@h2:4222,nats://h3:4222"},
		{"tls://user:p%40ss@h:4222", "tls://user:xxxxx@h:4222"},
		{"nats://user:p@ss@h:4222", "nats://user:xxxxx@h:4222"},
		{"redis://:s3cret@127.0.0.1:6379/0", "redis://:xxxxx@127.0.0.1:6379/0"},
		{"rediss://default:s3cret@h:6380/1?dial_timeout=1s", "rediss://default:xxxxx@h:6380/1?dial_timeout=1s"},
		{"redis+cluster://u:s3cret@h1:7000?addr=h2:7001", "redis+cluster://u:xxxxx@h1:7000?addr=h2:7001"},
		{"redis://user@h:6379", "redis://xxxxx@h:6379"},
		{"redis://user:@h:6379", "redis://user:@h:6379"},
		{"app:s3cret@tcp(10.0.0.5:3306)/sluice?timeout=5s", "app:xxxxx@tcp(10.0.0.5:3306)/sluice?timeout=5s"},
		{"app:s/cr@t@tcp(10.0.0.5:3306)/sluice", "app:xxxxx@tcp(10.0.0.5:3306)/sluice"},
		{"root@tcp(127.0.0.1:3306)/", "root@tcp(127.0.0.1:3306)/"},
		{"root:s3cret@tcp(127.0.0.1:3306", "root:xxxxx@tcp(127.0.0.1:3306"},
		{"", ""},
	} {
		if got := Conn(c.in); got != c.want {
			t.Errorf("Conn(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestSecretsGivesEachSecretAsWrittenAndDecoded(t *testing.T) {
	got := Secrets("nats://u:p%40ss@h:4222,nats://tok@h2")
	want := []string{"p%40ss", "p@ss", "tok"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Secrets = %q, want %q", got, want)
	}
	if got := Secrets("nats://h:4222"); len(got) != 0 {
		t.Fatalf("Secrets of a URL without userinfo = %q", got)
	}
}

func TestErrorHidesSecretsAndKeepsTheChain(t *testing.T) {
	raw := "nats://u:p%zz@h:4222"
	_, perr := url.Parse(raw) // quotes the whole URL, password included
	if perr == nil || !strings.Contains(perr.Error(), "p%zz") {
		t.Fatalf("url.Parse(%q) = %v: the test needs an error quoting the password", raw, perr)
	}
	err := Error(fmt.Errorf("connect: %w", perr), raw)
	if strings.Contains(err.Error(), "p%zz") || !strings.Contains(err.Error(), Mask) {
		t.Fatalf("Error = %q, want the password hidden", err)
	}
	var ue *url.Error
	if !errors.As(err, &ue) {
		t.Fatal("errors.As lost the *url.Error")
	}
	if Error(nil, raw) != nil {
		t.Fatal("Error(nil) != nil")
	}
	if e := Error(fs.ErrNotExist, "nats://h:4222"); e != fs.ErrNotExist {
		t.Fatalf("Error without secrets = %v, want err itself", e)
	}
}

func TestTextHidesTheLongestSecretFirst(t *testing.T) {
	if got := Text("pass password", "pass", "password", ""); got != "xxxxx xxxxx" {
		t.Fatalf("Text = %q", got)
	}
}
