import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class GroupedQueryAttention(nn.Module):
    """Grouped-query attention with rotary embeddings.

    Shapes (B = batch, T = sequence length):
        x:        (B, T, 4096)
        q:        (B, 32, T, 128)
        k, v:     (B, 8, T, 128)   -> repeated to (B, 32, T, 128)
        out:      (B, T, 4096)
    """

    def __init__(self, dim: int = 4096, n_heads: int = 32, n_kv_heads: int = 8, rope_theta: float = 500000.0):
        super().__init__()
        assert dim % n_heads == 0
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = dim // n_heads
        self.q_proj = nn.Linear(dim, n_heads * self.head_dim, bias=False)      # 4096 -> 4096
        self.k_proj = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)   # 4096 -> 1024
        self.v_proj = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)   # 4096 -> 1024
        self.o_proj = nn.Linear(n_heads * self.head_dim, dim, bias=False)
        inv_freq = 1.0 / (rope_theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (64,)

    def rotary(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        freqs = torch.outer(positions.float(), self.inv_freq)  # (T, 64)
        cos, sin = freqs.cos()[None, None], freqs.sin()[None, None]
        x1, x2 = x[..., ::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        pos = torch.arange(t, device=x.device)
        q, k = self.rotary(q, pos), self.rotary(k, pos)
        rep = self.n_heads // self.n_kv_heads  # 4
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


if __name__ == "__main__":
    torch.manual_seed(0)
    attn = GroupedQueryAttention()
    x = torch.randn(2, 128, 4096)
    y = attn(x)
    print(x.shape, "->", y.shape)
    # torch.Size([2, 128, 4096]) -> torch.Size([2, 128, 4096])
    n = sum(p.numel() for p in attn.parameters())
    print(f"{n:,} parameters ({n * 2 / 2**20:.1f} MiB in bf16)")
    # 41,943,040 parameters (80.0 MiB in bf16)
    print(attn.q_proj.weight.shape, attn.k_proj.weight.shape)
    # torch.Size([4096, 4096]) torch.Size([1024, 4096])
    print(math.prod([128, 64, 1024]), torch.Size([128, 64, 1024]).numel())
    # 8388608 8388608
