{{/* Chart name, truncated to 63 characters (a label value). */}}
{{- define "mass-jobs.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* name-version for the helm.sh/chart label. */}}
{{- define "mass-jobs.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Standard labels of every object (app.kubernetes.io/part-of and component come with each object). */}}
{{- define "mass-jobs.labels" -}}
helm.sh/chart: {{ include "mass-jobs.chart" . }}
app.kubernetes.io/name: {{ include "mass-jobs.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Namespace of every object: .Values.namespace, else the release namespace. */}}
{{- define "mass-jobs.namespace" -}}
{{- default .Release.Namespace .Values.namespace | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Judge key Secret data: every key named, every value empty. */}}
{{- define "mass-jobs.judgeKeys" -}}
{{- $keys := dict }}
{{- range .Values.judges.keys }}{{- $_ := set $keys . "" }}{{- end }}
{{- toYaml $keys }}
{{- end }}

{{/* CiliumNetworkPolicy ports (the port as a string) of a NetworkPolicy port list. */}}
{{- define "mass-jobs.ciliumPorts" -}}
{{- range . }}
- port: {{ .port | quote }}
  protocol: {{ .protocol }}
{{- end }}
{{- end }}

{{/* The Kueue queue label of GPU workloads (trainer jobs, predictors); nothing without kueue.queueName. */}}
{{- define "mass-jobs.kueueLabel" -}}
{{- with .Values.kueue.queueName }}
kueue.x-k8s.io/queue-name: {{ . | quote }}
{{- end }}
{{- end }}

{{/* The same label on Argo's step and agent pods, under Kueue's plain-pod integration only. */}}
{{- define "mass-jobs.kueuePodLabel" -}}
{{- if and .Values.kueue.queueName .Values.kueue.podIntegration }}
kueue.x-k8s.io/queue-name: {{ .Values.kueue.queueName | quote }}
{{- end }}
{{- end }}

{{/* Seconds a queued workload may wait for admission, added to its Argo step's deadline: 0 without Kueue. */}}
{{- define "mass-jobs.queueWait" -}}
{{- if .Values.kueue.queueName }}{{ .Values.kueue.maxQueueSeconds }}{{ else }}0{{ end }}
{{- end }}

{{/* A class of pods' scheduling fields (values scheduling.<class>): only those set. */}}
{{- define "mass-jobs.placement" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .priorityClassName }}
priorityClassName: {{ . | quote }}
{{- end }}
{{- end }}

{{/* The registry's pull Secrets on a ServiceAccount (values imagePullSecrets); nothing when none. */}}
{{- define "mass-jobs.pullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A GPU request line, (list COUNT RESOURCE), only for a COUNT above 0: a pod without GPUs requests
no GPU resource at all. */}}
{{- define "mass-jobs.gpus" -}}
{{- if gt (int (index . 0)) 0 -}}
{{ index . 1 }}: {{ index . 0 | quote }}
{{- end -}}
{{- end }}

{{/* A class's /tmp volume source (values scratch.<class>): an emptyDir on the node's disk, or with a
size a generic ephemeral volume (a PVC of storageClass, made and deleted with the pod). */}}
{{- define "mass-jobs.scratch" -}}
{{- if .size }}
ephemeral:
  volumeClaimTemplate:
    spec:
      accessModes:
      - ReadWriteOnce
      {{- with .storageClass }}
      storageClassName: {{ . | quote }}
      {{- end }}
      resources:
        requests:
          storage: {{ .size | quote }}
{{- else }}
emptyDir: {}
{{- end }}
{{- end }}

{{/* Argo's pendingTimeout of our pods (scheduling.pendingTimeoutSeconds; 0: none, rendered ""); a
pod gated by Kueue's plain-pod integration is Pending while queued, so the queue's bound is added. */}}
{{- define "mass-jobs.pendingTimeout" -}}
{{- $bound := int .Values.scheduling.pendingTimeoutSeconds -}}
{{- if eq $bound 0 }}{{ else if and .Values.kueue.queueName .Values.kueue.podIntegration }}{{ add $bound .Values.kueue.maxQueueSeconds }}{{ else }}{{ $bound }}{{ end }}
{{- end }}

{{/* The serve step's wait: a predictor pod held (unscheduled, queued, its image not pulling) this
long fails it; the pending bound plus the queue's under Kueue, 0 with no bound. */}}
{{- define "mass-jobs.predictorPending" -}}
{{- $bound := int .Values.scheduling.pendingTimeoutSeconds -}}
{{- if eq $bound 0 }}0{{ else }}{{ add $bound (include "mass-jobs.queueWait" . | atoi) }}{{ end }}
{{- end }}

{{/* The train step's first part: its job's Master running within the pending bound (plus the
queue's bound under Kueue); with no bound (0), the training deadline. */}}
{{- define "mass-jobs.trainStartDeadline" -}}
{{- $bound := int .Values.scheduling.pendingTimeoutSeconds -}}
{{- if eq $bound 0 }}{{ add .Values.resources.trainer.activeDeadlineSeconds (include "mass-jobs.queueWait" . | atoi) }}{{ else }}{{ add $bound (include "mass-jobs.queueWait" . | atoi) }}{{ end }}
{{- end }}

{{/* A trainer job got past Created (mass_jobs.k8s.training.started): its second condition, or its
third under Kueue (Suspended comes second). */}}
{{- define "mass-jobs.jobStarted" -}}
status.conditions.{{ if .Values.kueue.queueName }}2{{ else }}1{{ end }}.type
{{- end }}
