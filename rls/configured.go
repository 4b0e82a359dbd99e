package rls

// Configured reports whether the server has a configuration with at least
// one domain: until then every call is answered OK with no limit, so
// readiness waits for it (a directory of no configuration files, an xDS
// server that has sent nothing yet, or one that withdrew every domain).
func (s *Server) Configured() bool {
	c := s.conf.Load()
	return c != nil && len(c.domains) > 0
}
