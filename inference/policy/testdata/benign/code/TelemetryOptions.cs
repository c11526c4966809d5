using System;
using System.Reflection;
using System.Runtime.CompilerServices;

[assembly: AssemblyVersion("4.0.0.0")]
[assembly: AssemblyFileVersion("4.2.1.17")]
[assembly: AssemblyInformationalVersion("4.2.1+3f9c2e1a")]
[assembly: InternalsVisibleTo("Infer.Telemetry.Tests, PublicKey=0024000004800000940000000602000000240000525341310004000001000100b5fc90e7027f67")]

namespace Infer.Telemetry
{
    /// <summary>Options bound from the "Telemetry" configuration section.</summary>
    public sealed class TelemetryOptions
    {
        public const int DefaultBatchSize = 512;
        public const int MaxBatchSize = 8192;
        public static readonly TimeSpan DefaultFlushInterval = TimeSpan.FromMilliseconds(2500);
        public static readonly TimeSpan DefaultTimeout = new TimeSpan(0, 0, 0, 30, 0);

        public string Endpoint { get; set; } = "https://telemetry.example.com/v2/ingest";
        public int BatchSize { get; set; } = DefaultBatchSize;
        public TimeSpan FlushInterval { get; set; } = DefaultFlushInterval;
        public double SampleRate { get; set; } = 0.125;
        public int[] HistogramBucketsMs { get; set; } = { 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 10000 };
        public Guid InstallationId { get; set; } = new Guid("6f1c2d3e-4b5a-4c7d-8e9f-0a1b2c3d4e5f");
        public DateTimeOffset NotBefore { get; set; } = new DateTimeOffset(2024, 3, 5, 0, 0, 0, TimeSpan.Zero);

        public void Validate()
        {
            if (BatchSize is < 1 or > MaxBatchSize)
                throw new ArgumentOutOfRangeException(nameof(BatchSize), BatchSize, $"must be in 1..{MaxBatchSize}");
            if (SampleRate is < 0 or > 1)
                throw new ArgumentOutOfRangeException(nameof(SampleRate), SampleRate, "must be in [0, 1]");
        }
    }
}

// dotnet --info (excerpt)
//  Version:           8.0.201
//  Commit:            4c2d78f037
//  Workload version:  8.0.200-manifests.3097af8b
//  OS Version:        10.0.22631
//  RID:               win-x64
//  Microsoft.NETCore.App 8.0.2 [C:\Program Files\dotnet\shared\Microsoft.NETCore.App]
//  System.Private.CoreLib, Version=8.0.0.0, Culture=neutral, PublicKeyToken=7cec85d7bea7798e
