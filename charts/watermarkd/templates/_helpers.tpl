{{/*
The chart name, or nameOverride: the app.kubernetes.io/name label. Kubernetes names and label
values stop at 63 characters.
*/}}
{{- define "watermarkd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The prefix of every object name. A release called "watermarkd" (or "prod-watermarkd") is not
suffixed again, so the default install's objects are plainly "watermarkd".
*/}}
{{- define "watermarkd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "watermarkd.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "watermarkd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The labels the Deployment selects its pods by. Never change them: a Deployment's selector is
immutable, so an upgrade that changed them would fail.
*/}}
{{- define "watermarkd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "watermarkd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The Kubernetes recommended labels, on every object. */}}
{{- define "watermarkd.labels" -}}
{{ include "watermarkd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: controller
app.kubernetes.io/part-of: watermarkd
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "watermarkd.chart" . }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "watermarkd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "watermarkd.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name the existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "watermarkd.leaseName" -}}
{{- default (include "watermarkd.fullname" .) .Values.leaderElection.leaseName -}}
{{- end -}}

{{- define "watermarkd.configMapName" -}}
{{- default (include "watermarkd.fullname" .) .Values.rules.existingConfigMap -}}
{{- end -}}

{{- define "watermarkd.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* Where the daemon reads its files: the ConfigMap, mounted as a directory. */}}
{{- define "watermarkd.rulesPath" -}}/etc/watermarkd/rules.toml{{- end -}}

{{/*
The status API's own token (status.token.existingSecret): the Secret's key, mounted as the file
"token" of this directory (a directory, never subPath, so that a new token reaches the pod).
*/}}
{{- define "watermarkd.statusTokenDir" -}}/etc/watermarkd-status{{- end -}}
{{- define "watermarkd.statusTokenPath" -}}{{ include "watermarkd.statusTokenDir" . }}/token{{- end -}}

{{/* "true" when the pods mount the status token Secret (the status API on, a Secret named). */}}
{{- define "watermarkd.statusToken" -}}
{{- if and .Values.status.enabled .Values.status.token.existingSecret -}}true{{- end -}}
{{- end -}}

{{/* "true" when the status API accepts TokenReview-authenticated tokens, which needs RBAC. */}}
{{- define "watermarkd.statusTokenReview" -}}
{{- if and .Values.status.enabled .Values.status.tokenReview -}}true{{- end -}}
{{- end -}}

{{/* The daemon's listener: /metrics, the probes and the status API and page. */}}
{{- define "watermarkd.listen" -}}0.0.0.0:8080{{- end -}}

{{/*
The Host names a request without a token may use (status.allowed_hosts), as a JSON list: the
Service's own names, when there is a Service, then status.allowedHosts. IP addresses and
localhost need no listing.
*/}}
{{- define "watermarkd.statusAllowedHosts" -}}
{{- $hosts := list -}}
{{- if .Values.service.enabled -}}
{{- $service := printf "%s-metrics" (include "watermarkd.fullname" .) -}}
{{- $hosts = append $hosts $service -}}
{{- $hosts = append $hosts (printf "%s.%s" $service .Release.Namespace) -}}
{{- $hosts = append $hosts (printf "%s.%s.svc" $service .Release.Namespace) -}}
{{- end -}}
{{- range .Values.status.allowedHosts }}{{ $hosts = append $hosts (lower . | trimSuffix ".") }}{{ end -}}
{{- $hosts | uniq | toJson -}}
{{- end -}}

{{/*
The settings as (TOML key, TOML value) pairs, "lease." keys for the [lease] table and "status."
keys for the [status] table; values are TOML literals (strings as JSON strings, which TOML reads
the same). Rendered as watermarkd.toml, or as WATERMARKD__* variables when the rules come from
an existing ConfigMap. Keys left out keep the daemon's defaults; the Lease namespace and identity
come from POD_NAMESPACE and POD_NAME. A switch whose value is the daemon's default is left out
too, so the default values render no [status] table at all.
*/}}
{{- define "watermarkd.settingsPairs" -}}
{{- $s := .Values.settings -}}
{{- $le := .Values.leaderElection -}}
{{- $pairs := list -}}
{{- $pairs = append $pairs (list "rules" (include "watermarkd.rulesPath" . | toJson)) -}}
{{- $pairs = append $pairs (list "crd" (ternary "true" "false" .Values.crd.enabled)) -}}
{{- /* Every interface: the kubelet probes and Prometheus scrapes the pod's own address (the
daemon's default is 127.0.0.1:8080). */ -}}
{{- $pairs = append $pairs (list "listen" (include "watermarkd.listen" . | toJson)) -}}
{{- with .Values.watchNamespaces }}{{ $pairs = append $pairs (list "namespaces" (toJson .)) }}{{ end -}}
{{- if .Values.crd.enabled }}{{ with .Values.crd.selector }}{{ $pairs = append $pairs (list "wpa_selector" (toJson .)) }}{{ end }}{{ end -}}
{{- $pairs = append $pairs (list "default_backend" (toJson $s.defaultBackend)) -}}
{{- $pairs = append $pairs (list "log_format" (toJson $s.logFormat)) -}}
{{- $pairs = append $pairs (list "log_level" (toJson $s.logLevel)) -}}
{{- if $s.dryRun }}{{ $pairs = append $pairs (list "dry_run" "true") }}{{ end -}}
{{- with $s.defaultInterval }}{{ $pairs = append $pairs (list "default_interval" (toJson .)) }}{{ end -}}
{{- with $s.maxConcurrency }}{{ $pairs = append $pairs (list "max_concurrency" (toString (int .))) }}{{ end -}}
{{- with $s.reloadPoll }}{{ $pairs = append $pairs (list "reload_poll" (toJson .)) }}{{ end -}}
{{- with $s.clusterName }}{{ $pairs = append $pairs (list "cluster_name" (toJson .)) }}{{ end -}}
{{- with $s.labelsAsTags }}{{ $pairs = append $pairs (list "labels_as_tags" (toJson .)) }}{{ end -}}
{{- with $s.recommenderAllowedUrls }}{{ $pairs = append $pairs (list "recommender_allowed_urls" (toJson .)) }}{{ end -}}
{{- with $s.recommenderTlsDir }}{{ $pairs = append $pairs (list "recommender_tls_dir" (toJson .)) }}{{ end -}}
{{- $pairs = append $pairs (list "lease.name" (include "watermarkd.leaseName" . | toJson)) -}}
{{- with $le.leaseDuration }}{{ $pairs = append $pairs (list "lease.duration" (toJson .)) }}{{ end -}}
{{- with $le.renewDeadline }}{{ $pairs = append $pairs (list "lease.renew_deadline" (toJson .)) }}{{ end -}}
{{- with $le.retryPeriod }}{{ $pairs = append $pairs (list "lease.retry_period" (toJson .)) }}{{ end -}}
{{- $st := .Values.status -}}
{{- if not $st.enabled }}
{{- $pairs = append $pairs (list "status.enabled" "false") -}}
{{- else }}
{{- with $st.history }}{{ $pairs = append $pairs (list "status.history" (toJson .)) }}{{ end -}}
{{- if include "watermarkd.statusToken" . }}{{ $pairs = append $pairs (list "status.token_file" (include "watermarkd.statusTokenPath" . | toJson)) }}{{ end -}}
{{- if $st.tokenReview }}{{ $pairs = append $pairs (list "status.token_review" "true") }}{{ end -}}
{{- if and $st.tokenReview (ne (toJson $st.tokenAudiences) (toJson (list "watermarkd"))) }}{{ $pairs = append $pairs (list "status.token_audiences" (toJson $st.tokenAudiences)) }}{{ end -}}
{{- if $st.openOnLoopback }}{{ $pairs = append $pairs (list "status.open_on_loopback" "true") }}{{ end -}}
{{- with (include "watermarkd.statusAllowedHosts" . | fromJsonArray) }}{{ $pairs = append $pairs (list "status.allowed_hosts" (toJson .)) }}{{ end -}}
{{- end }}
{{- toJson $pairs -}}
{{- end -}}

{{/* watermarkd.toml. */}}
{{- define "watermarkd.settingsToml" -}}
# Settings of `watermarkd run`, rendered from the chart's values (settings, crd,
# watchNamespaces, leaderElection, status). The Lease namespace and identity come from
# POD_NAMESPACE and POD_NAME; everything not set here keeps its default.
{{- $lease := list }}
{{- $status := list }}
{{- range (include "watermarkd.settingsPairs" . | fromJsonArray) }}
{{- if hasPrefix "lease." (index . 0) }}
{{- $lease = append $lease . }}
{{- else if hasPrefix "status." (index . 0) }}
{{- $status = append $status . }}
{{- else }}
{{ index . 0 }} = {{ index . 1 }}
{{- end }}
{{- end }}

# Leader election among the replicas.
[lease]
{{- range $lease }}
{{ index . 0 | trimPrefix "lease." }} = {{ index . 1 }}
{{- end }}
{{- if $status }}

# The status API and page on the listener (/api/v1, /ui).
[status]
{{- range $status }}
{{ index . 0 | trimPrefix "status." }} = {{ index . 1 }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The same settings as environment variables (`__` separates the [lease] and [status] tables,
e.g. WATERMARKD__STATUS__TOKEN_REVIEW): TOML strings lose their quotes, lists become
comma-separated.
*/}}
{{- define "watermarkd.settingsEnv" -}}
{{- range (include "watermarkd.settingsPairs" . | fromJsonArray) }}
{{- $value := index . 1 }}
{{- if hasPrefix "[" $value }}
{{- $value = fromJsonArray $value | join "," }}
{{- else if hasPrefix "\"" $value }}
{{- $value = fromJson (printf "{\"v\":%s}" $value) | dig "v" "" }}
{{- end }}
- name: {{ printf "WATERMARKD__%s" (index . 0 | replace "." "__" | upper) }}
  value: {{ $value | quote }}
{{- end }}
{{- end -}}
