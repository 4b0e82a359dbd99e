{{/* The chart's name, or nameOverride. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every resource name: the release name, plus the chart's
name unless the release name contains it; fullnameOverride replaces it. Kept
to 48 characters so that "-limiter-rls" and the like still fit in 63. */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 48 | trimSuffix "-" }}
{{- else }}
{{- $name := include "sluice.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 48 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 48 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component: call with (dict "ctx" $ "component" "limiter"). */}}
{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The image of one component: call with (dict "ctx" $ "component" "limiter"). */}}
{{- define "sluice.image" -}}
{{- $c := index .ctx.Values .component }}
{{- $repo := $c.image.repository }}
{{- with .ctx.Values.image.registry }}
{{- $repo = printf "%s/%s" (trimSuffix "/" .) $repo }}
{{- end }}
{{- printf "%s:%s" $repo (default .ctx.Chart.AppVersion .ctx.Values.image.tag) }}
{{- end }}

{{/* The NATS URL: natsUrl, else the Service of the NATS chart installed as a
dependency (named as that chart names it). */}}
{{- define "sluice.natsUrl" -}}
{{- if .Values.natsUrl }}
{{- .Values.natsUrl }}
{{- else if .Values.nats.enabled }}
{{- $svc := "" }}
{{- with (get (default dict (get .Values.nats "service")) "name") }}
{{- $svc = . }}
{{- else }}
{{- with (get .Values.nats "fullnameOverride") }}
{{- $svc = . | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default "nats" (get .Values.nats "nameOverride") }}
{{- if contains $name .Release.Name }}
{{- $svc = .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $svc = printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}
{{- $port := 4222 }}
{{- with (get .Values.nats "config") }}{{ with (get . "nats") }}{{ with (get . "port") }}{{ $port = . }}{{ end }}{{ end }}{{ end }}
{{- printf "nats://%s:%v" $svc $port }}
{{- else }}
{{- fail "set natsUrl (the region's NATS servers) or nats.enabled (the NATS chart with this release)" }}
{{- end }}
{{- end }}

{{/* Environment both components share: NATS, region, prefixes, metrics,
logs, Redis. */}}
{{- define "sluice.commonEnv" -}}
- name: SLUICE_NATS_URL
  value: {{ include "sluice.natsUrl" . | quote }}
{{- with .Values.region }}
- name: SLUICE_REGION
  value: {{ . | quote }}
{{- end }}
- name: SLUICE_SUBJECT_PREFIX
  value: {{ .Values.subjectPrefix | quote }}
- name: SLUICE_METRICS_ADDR
  value: {{ printf ":%v" .Values.metricsPort | quote }}
- name: SLUICE_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- if .Values.redis.existingSecret }}
- name: SLUICE_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.redis.existingSecret }}
      key: {{ .Values.redis.secretKey }}
{{- end }}
- name: SLUICE_REDIS_PREFIX
  value: {{ .Values.redis.prefix | quote }}
{{- with .Values.natsAuth.credsSecret }}
- name: SLUICE_NATS_CREDS
  value: /etc/sluice/nats-creds/{{ $.Values.natsAuth.credsKey }}
{{- end }}
{{- if .Values.natsAuth.tlsSecret }}
- name: SLUICE_NATS_TLS_CA
  value: /etc/sluice/nats-tls/ca.crt
{{- if .Values.natsAuth.tlsClientCert }}
- name: SLUICE_NATS_TLS_CERT
  value: /etc/sluice/nats-tls/tls.crt
- name: SLUICE_NATS_TLS_KEY
  value: /etc/sluice/nats-tls/tls.key
{{- end }}
{{- end }}
{{- end }}

{{/* Volume mounts and volumes of the NATS Secrets. */}}
{{- define "sluice.natsMounts" -}}
{{- with .Values.natsAuth.credsSecret }}
- name: nats-creds
  mountPath: /etc/sluice/nats-creds
  readOnly: true
{{- end }}
{{- with .Values.natsAuth.tlsSecret }}
- name: nats-tls
  mountPath: /etc/sluice/nats-tls
  readOnly: true
{{- end }}
{{- end }}
{{- define "sluice.natsVolumes" -}}
{{- with .Values.natsAuth.credsSecret }}
- name: nats-creds
  secret:
    secretName: {{ . }}
{{- end }}
{{- with .Values.natsAuth.tlsSecret }}
- name: nats-tls
  secret:
    secretName: {{ . }}
{{- end }}
{{- end }}

{{/* Arguments of one component: serve, then its flags map as --name=value
(sorted), so that the binary refuses an unknown one. Call with (dict "ctx" $
"component" "limiter"). */}}
{{- define "sluice.args" -}}
- serve
{{- $flags := (index .ctx.Values .component).flags }}
{{- range $name := keys $flags | sortAlpha }}
{{- $v := index $flags $name }}
{{- if and (kindIs "float64" $v) (eq $v (float64 (int64 $v))) }}
{{- $v = int64 $v }}
{{- end }}
- {{ printf "--%s=%v" (trimPrefix "--" $name) $v | quote }}
{{- end }}
{{- end }}

{{/* The probes on --metrics-addr: call with the component's probes values. */}}
{{- define "sluice.probes" -}}
livenessProbe:
  httpGet:
    path: /healthz
    port: metrics
  {{- toYaml .liveness | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  {{- toYaml .readiness | nindent 2 }}
{{- end }}

{{/* The limiter's volume mounts and volumes: NATS Secrets, the rate limit
service's configuration and certificates. */}}
{{- define "sluice.limiterMounts" -}}
{{- include "sluice.natsMounts" . }}
{{- $rls := .Values.limiter.rls }}
{{- if $rls.enabled }}
- name: rls-config
  mountPath: /etc/sluice/rls
  readOnly: true
{{- with $rls.tls.secretName }}
- name: rls-tls
  mountPath: /etc/sluice/rls-tls
  readOnly: true
{{- end }}
{{- end }}
{{- end }}
{{- define "sluice.limiterVolumes" -}}
{{- include "sluice.natsVolumes" . }}
{{- $rls := .Values.limiter.rls }}
{{- if $rls.enabled }}
- name: rls-config
  configMap:
    name: {{ or $rls.existingConfigMap (printf "%s-rls" (include "sluice.fullname" .)) }}
{{- with $rls.tls.secretName }}
- name: rls-tls
  secret:
    secretName: {{ . }}
{{- end }}
{{- end }}
{{- end }}
